-- maria-replica, first start only: run as root by the mariadb image's
-- entrypoint from /docker-entrypoint-initdb.d. The replica starts from an
-- empty GTID position and replays maria-primary's whole binary log, which
-- holds the `shop` database, its user and the accounts of
-- maria-primary-init.sql (the image's own root/healthcheck setup is never
-- binlogged, on either server). So nothing else may be created here: with
-- gtid-strict-mode a local write would conflict with the replicated ones.
-- The replication threads start now and again on every later start.
-- Password is a demo value; it must match maria-primary-init.sql.
SET SESSION sql_log_bin = 0;
CHANGE MASTER TO
  MASTER_HOST = 'maria-primary',
  MASTER_PORT = 3306,
  MASTER_USER = 'replicator',
  MASTER_PASSWORD = 'replicator-secret',
  MASTER_USE_GTID = slave_pos,
  MASTER_CONNECT_RETRY = 1;
START SLAVE;
