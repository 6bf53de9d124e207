-- The other shape: 500 rows deleted in a transaction that commits once they are confirmed.
BEGIN;
WITH c AS (SELECT id FROM relay_shapes WHERE lease IS NULL AND group_name = ''
           ORDER BY priority, run_at, id LIMIT 500 FOR UPDATE SKIP LOCKED)
DELETE FROM relay_shapes t USING c WHERE t.id = c.id RETURNING t.id, t.payload;
COMMIT;
