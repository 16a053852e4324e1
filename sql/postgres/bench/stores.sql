-- The schemas holding a relaybus store (0.1 or 0.2) with deliveries in it, the benchmark's own
-- aside: a bench loads the server such a store's workers live on. A drained store, as a
-- benchmark harness leaves one, does not count. One row per store, read with LIMIT 1.
-- params:
SELECT s.table_schema FROM (
  SELECT DISTINCT c.table_schema, c.table_name FROM information_schema.columns c
   WHERE c.table_name LIKE '%deliveries' AND c.column_name = 'event_id'
     AND c.table_schema NOT LIKE 'relaybus\_bench\_%') s
 WHERE (xpath('/row/n/text()', query_to_xml(format(
          'SELECT count(*) AS n FROM (SELECT 1 FROM %I.%I LIMIT 1) x', s.table_schema, s.table_name),
          false, true, '')))[1]::text <> '0'
 ORDER BY 1
