#!/usr/bin/env bash
# A throwaway PostgreSQL server on 127.0.0.1 for tests and for shared Optuna studies.
#
#   .ci/postgres/local-server.sh start    install (if needed), initialize, start; prints the URL
#   .ci/postgres/local-server.sh stop     stop it and delete its data
#   .ci/postgres/local-server.sh status   print whether it runs, and the URL
#   .ci/postgres/local-server.sh url      print the URL only
#
# The URL: postgresql://postgres@127.0.0.1:55432/plexus_tune_test (optuna, SQLAlchemy;
# the driver psycopg2 is SQLAlchemy's default for postgresql://).
#
# Authentication is "trust" for connections from 127.0.0.1 and the Unix socket: anyone
# on this host can connect as any role. It is meant for tests on a machine of one's
# own, never for data worth keeping. `stop` deletes the data directory (set
# PLEXUS_PG_KEEP=1 to keep it; `start` then reuses it).
#
# Paths (DIR can be moved with PLEXUS_PG_DIR, the port with PLEXUS_PG_PORT):
#   DIR=/run/plexus-tune/postgres    owned by this script (and by the postgres user when run
#                                    as root, since the server refuses to run as root)
#     data/                          the cluster (initdb), removed by stop
#     server.log                     the server's log
#     .s.PGSQL.55432                 the server's Unix socket
# Needs the PostgreSQL server binaries; when none are found, it installs Debian's
# `postgresql` package (root, apt-get).
set -euo pipefail

DIR=${PLEXUS_PG_DIR:-/run/plexus-tune/postgres}
PORT=${PLEXUS_PG_PORT:-55432}
DB=plexus_tune_test
URL="postgresql://postgres@127.0.0.1:$PORT/$DB"
DATA=$DIR/data
LOG=$DIR/server.log

log() { echo "local-server: $*" >&2; }
die() { log "error: $*"; exit 1; }

pg_bindir() {
    local d
    d=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$d" ] && [ -x "$d/pg_ctl" ]; then
        echo "$d"
    elif command -v pg_ctl >/dev/null && command -v initdb >/dev/null; then
        dirname "$(command -v pg_ctl)"
    else
        return 1
    fi
}

install_packages() {
    pg_bindir >/dev/null && return
    [ "$(id -u)" = 0 ] || die "PostgreSQL is not installed and installing it needs root"
    command -v apt-get >/dev/null || die "PostgreSQL is not installed and there is no apt-get"
    log "installing postgresql from the distribution's packages"
    local t0=$SECONDS policy=/usr/sbin/policy-rc.d own_policy=0 rc=0
    # keep the package from starting its own cluster on port 5432
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        own_policy=1
    fi
    {
        apt-get update -q \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql
    } >"$DIR/apt.log" 2>&1 || rc=$?
    [ "$own_policy" = 1 ] && rm -f "$policy"
    if [ "$rc" != 0 ]; then
        tail -n 30 "$DIR/apt.log" >&2
        die "apt-get failed (full log: $DIR/apt.log)"
    fi
    log "installed in $((SECONDS - t0)) s"
}

# run a command as the user that owns the cluster
as_owner() {
    if [ "$(id -u)" = 0 ]; then
        (cd "$DIR" && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

running() {
    local bin
    bin=$(pg_bindir) || return 1
    [ -f "$DATA/postmaster.pid" ] && as_owner "$bin/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

cmd_start() {
    mkdir -p "$DIR"
    install_packages
    local bin
    bin=$(pg_bindir) || die "no PostgreSQL server binaries found after installing"
    if running; then
        log "already running"
        echo "$URL"
        return
    fi
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || die "user postgres is missing (it comes with Debian's postgresql package)"
        chown postgres: "$DIR"
    fi
    if [ ! -s "$DATA/PG_VERSION" ]; then
        rm -rf "$DATA"
        as_owner "$bin/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
            --no-sync >"$DIR/initdb.log" 2>&1 || { cat "$DIR/initdb.log" >&2; die "initdb failed"; }
    fi
    # fsync off: a crash loses this throwaway cluster, which is acceptable for tests
    as_owner "$bin/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start -o \
        "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
        >/dev/null || { tail -n 30 "$LOG" >&2 || true; die "the server did not start (log: $LOG)"; }
    for _ in $(seq 60); do
        "$bin/pg_isready" -q -h 127.0.0.1 -p "$PORT" && break
        sleep 0.5
    done
    "$bin/pg_isready" -q -h 127.0.0.1 -p "$PORT" || { tail -n 30 "$LOG" >&2; die "the server does not accept connections"; }
    if [ "$("$bin/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != 1 ]; then
        "$bin/createdb" -h 127.0.0.1 -p "$PORT" -U postgres "$DB"
    fi
    log "running on 127.0.0.1:$PORT (data $DATA, log $LOG)"
    echo "$URL"
}

cmd_stop() {
    local bin
    if bin=$(pg_bindir) && [ -f "$DATA/postmaster.pid" ]; then
        as_owner "$bin/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null 2>&1 || true
        log "stopped"
    fi
    if [ "${PLEXUS_PG_KEEP:-0}" != 1 ]; then
        rm -rf "$DATA"
    fi
}

cmd_status() {
    if running; then
        echo "running: $URL"
    else
        echo "not running"
        return 3
    fi
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    url) echo "$URL" ;;
    *) echo "usage: $0 start|stop|status|url" >&2; exit 2 ;;
esac
