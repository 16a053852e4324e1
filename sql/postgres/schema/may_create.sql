-- Whether the current role may create objects in the schema: a runtime role with DML grants
-- only may not, and setup then changes nothing on a current store.
-- params:
SELECT has_schema_privilege(current_user, '{{schema}}', 'CREATE')
