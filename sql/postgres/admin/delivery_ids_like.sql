-- The deliveries whose id begins or ends with $1 (a short id as a table shows it), at most $2:
-- what an operator's shortened id stands for. No index serves a suffix: it reads the table
-- through, on the path of a command that was given less than a whole id.
-- params: text, int8
SELECT id FROM "{{schema}}"."{{prefix}}deliveries"
 WHERE starts_with(id, $1) OR right(id, length($1)) = $1
 ORDER BY id LIMIT $2
