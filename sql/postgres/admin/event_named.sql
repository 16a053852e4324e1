-- Whether any event names a handler (given as $1) or has a type (given as $2): whether the store
-- has ever seen a name an operator typed. No index serves it: it stops at the first event found,
-- and reads the events through only for a name no event carries (a typo, on an error path).
-- params: text, text
SELECT EXISTS (SELECT 1 FROM "{{schema}}"."{{prefix}}events"
                WHERE ($1::text IS NULL OR handlers @> ARRAY[$1::text])
                  AND ($2::text IS NULL OR type = $2))
