-- The filters of `events list` and `events replay` over events `e`, shared by the statements
-- that take them as $1..$10: a filter given as null (or an empty array) drops out of the plan,
-- which is made per call for its values. The time bounds reach the creation-time index; the
-- other filters are checked on the events in the range.
(cardinality($1::text[]) = 0 OR e.type LIKE ANY ($1::text[]))
   AND ($2::text IS NULL OR e.key = $2::text)
   AND ($3::text IS NULL OR e.handlers @> ARRAY[$3::text])
   AND (cardinality($4::text[]) = 0 OR e.id = ANY ($4::text[]))
   -- since (inclusive): a time, or an event
   AND ($5::timestamptz IS NULL OR e.created_at >= $5::timestamptz)
   AND ($5::timestamptz IS NULL OR $6::text IS NULL OR e.created_at > $5::timestamptz
        OR e.id >= $6::text)
   -- after (exclusive): an event
   AND ($7::timestamptz IS NULL OR e.created_at >= $7::timestamptz)
   AND ($7::timestamptz IS NULL OR e.created_at > $7::timestamptz OR e.id > $8::text)
   -- until (inclusive): a time, or an event
   AND ($9::timestamptz IS NULL OR e.created_at <= $9::timestamptz)
   AND ($9::timestamptz IS NULL OR $10::text IS NULL OR e.created_at < $9::timestamptz
        OR e.id <= $10::text)
