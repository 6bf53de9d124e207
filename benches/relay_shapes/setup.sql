-- A table shaped like a queue's (the ready index, a lease column), 100,000 rows of 100 bytes.
SET client_min_messages = warning;
DROP TABLE IF EXISTS relay_shapes;
CREATE TABLE relay_shapes (
  id bigserial PRIMARY KEY, group_name text NOT NULL DEFAULT '', payload bytea,
  lease bigint, lease_until timestamptz, attempts int DEFAULT 0,
  created_at timestamptz DEFAULT now(), run_at timestamptz DEFAULT now(), priority int DEFAULT 0);
CREATE INDEX ON relay_shapes (group_name, priority, run_at, id) WHERE lease IS NULL;
-- Stands in for the primary-key lookups of the relay's `lease = ? AND id IN (...)`.
CREATE INDEX ON relay_shapes (lease);
INSERT INTO relay_shapes (payload) SELECT decode(repeat('ab', 100), 'hex') FROM generate_series(1, 100000);
VACUUM ANALYZE relay_shapes;
