-- Whether any delivery of these handlers is due, for `run --drain`: one probe of the due index
-- per lane (the index leads with the lane).
-- $1 handlers.
-- params: text[]
SELECT EXISTS (SELECT 1 FROM "{{schema}}"."{{prefix}}lanes" l
                WHERE EXISTS (SELECT 1 FROM "{{schema}}"."{{prefix}}deliveries" d
                               WHERE d.lane = l.lane AND d.status = 'pending'
                                 AND d.available_at <= now() AND d.handler = ANY ($1)))
