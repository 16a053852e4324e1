-- The session settings a worker behind a transaction pooler inherits from its role.
-- params:
SELECT current_user::text, current_setting('jit'), current_setting('plan_cache_mode')
