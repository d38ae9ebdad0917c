#!/usr/bin/env bash
# pg-replica1/pg-replica2 entrypoint. On the first start (empty data
# directory) clone pg-primary with `pg_basebackup -R`, which also writes
# standby.signal and primary_conninfo (postgresql.auto.conf), so the server
# comes up as a streaming replica. Later starts keep the clone. Then hand over
# to the postgres image's own entrypoint, which finds an existing cluster,
# skips initdb and starts `postgres` as the postgres user.
# Settings come from compose.yml: PRIMARY_HOST, REPLICATION_USER,
# REPLICATION_PASSWORD, APPLICATION_NAME (demo values; the password must not
# contain spaces or quotes, as it goes into a conninfo string unquoted).
set -euo pipefail

PGDATA="${PGDATA:-/var/lib/postgresql/data}"
: "${PRIMARY_HOST:?}" "${REPLICATION_USER:?}" "${REPLICATION_PASSWORD:?}"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  echo "pg-replica: cloning $PRIMARY_HOST into $PGDATA"
  mkdir -p "$PGDATA"
  chown postgres:postgres "$PGDATA"
  chmod 0700 "$PGDATA"
  # compose waits for the primary's healthcheck; wait here too in case it restarted.
  until pg_isready -q -h "$PRIMARY_HOST" -p 5432; do sleep 1; done
  # As postgres, so the files belong to the server's user. On failure
  # pg_basebackup empties $PGDATA again, so the next start retries cleanly.
  gosu postgres pg_basebackup \
    --pgdata="$PGDATA" \
    --dbname="host=$PRIMARY_HOST port=5432 user=$REPLICATION_USER password=$REPLICATION_PASSWORD application_name=${APPLICATION_NAME:-pg-replica}" \
    --wal-method=stream \
    --checkpoint=fast \
    --write-recovery-conf
fi

exec docker-entrypoint.sh "$@"
