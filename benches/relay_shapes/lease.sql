-- The relay today: 500 rows claimed under a lease, then deleted once confirmed.
BEGIN;
WITH c AS (SELECT id FROM relay_shapes WHERE lease IS NULL AND group_name = ''
           ORDER BY priority, run_at, id LIMIT 500 FOR UPDATE SKIP LOCKED)
UPDATE relay_shapes t SET lease = 42, lease_until = now() + interval '30 s', attempts = attempts + 1
  FROM c WHERE t.id = c.id RETURNING t.id, t.payload;
COMMIT;
DELETE FROM relay_shapes WHERE lease = 42;
