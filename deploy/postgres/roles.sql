-- Quire's roles, run once on the primary as a superuser (psql -f roles.sql); they reach the
-- standby with the WAL. Set the passwords with \password afterwards, never in this file.

-- The metadata service: owns its database, runs its migrations (Alembic) at start. Not a
-- superuser.
CREATE ROLE quire LOGIN;
CREATE DATABASE quire OWNER quire;

-- The standby's streaming connection: replication, nothing else.
CREATE ROLE quire_replication LOGIN REPLICATION;
SELECT pg_create_physical_replication_slot('standby1');

-- pg_rewind's connection to the new primary (its --source-server): the functions it reads
-- files with, nothing else (PostgreSQL's documented grants for a non-superuser).
CREATE ROLE quire_rewind LOGIN;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_ls_dir(text, boolean, boolean) TO quire_rewind;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_stat_file(text, boolean) TO quire_rewind;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text) TO quire_rewind;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text, bigint, bigint, boolean)
    TO quire_rewind;
