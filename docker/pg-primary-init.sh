#!/usr/bin/env bash
# pg-primary, first start only: run by the postgres image's entrypoint from
# /docker-entrypoint-initdb.d while the fresh cluster is up on its local socket
# only. Creates the streaming-replication role, the application role and its
# database, and lets the replication role connect from the compose network.
# Names and passwords come from compose.yml (demo values).
set -e

psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --dbname postgres \
  -v repl_user="$REPLICATION_USER" -v repl_password="$REPLICATION_PASSWORD" \
  -v app_user="$APP_USER" -v app_password="$APP_PASSWORD" <<'SQL'
CREATE ROLE :"repl_user" WITH LOGIN REPLICATION PASSWORD :'repl_password';
CREATE ROLE :"app_user" WITH LOGIN PASSWORD :'app_password';
CREATE DATABASE :"app_user" OWNER :"app_user";
SQL

# `samenet`: any address on a subnet this server is attached to, i.e. the
# compose network. Appended after the image's `host all all all
# scram-sha-256`, whose `all` never matches replication connections. The file
# is read when the entrypoint restarts the server after these scripts.
echo "host replication $REPLICATION_USER samenet scram-sha-256" >> "$PGDATA/pg_hba.conf"
