-- maria-primary, first start only: run as root by the mariadb image's
-- entrypoint from /docker-entrypoint-initdb.d, after it created the `shop`
-- database and user (MARIADB_DATABASE / MARIADB_USER in compose.yml).
-- Everything here is written to the binary log, so maria-replica gets these
-- users (and the `shop` database and user) through replication itself.
-- Passwords are demo values; they must match compose.yml and fulcrum.toml.

-- The account maria-replica replicates with (maria-replica-init.sql).
CREATE USER 'replicator'@'%' IDENTIFIED BY 'replicator-secret';
GRANT REPLICATION SLAVE ON *.* TO 'replicator'@'%';

-- Fulcrum's health probe (health_user in fulcrum.toml). It reads
-- @@read_only and the GTID positions, which need no privilege, and
-- SHOW SLAVE STATUS, which needs SLAVE MONITOR on MariaDB 10.5.9 and later.
-- It connects to information_schema, which every account may use, so it
-- gets no access to application data.
CREATE USER 'fulcrum_monitor'@'%' IDENTIFIED BY 'monitor-secret';
GRANT SLAVE MONITOR ON *.* TO 'fulcrum_monitor'@'%';
