#!/usr/bin/env bash
# Starts or stops a throw-away 3-master Redis Cluster on loopback, for manual testing.
# (`cargo test -p tower-idempotency-redis` starts and stops its own cluster; this script is not
# needed for the tests.)
#
#   scripts/redis-cluster.sh start DIR   # prints the node URLs, one per line
#   scripts/redis-cluster.sh stop DIR    # kills the nodes and removes DIR
#
# Ports: REDIS_CLUSTER_PORT (default 7101) and the next two; cluster bus ports are +10000.
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
dir=$2
base=${REDIS_CLUSTER_PORT:-7101}
ports=("$base" "$((base + 1))" "$((base + 2))")

start() {
    command -v redis-server >/dev/null && command -v redis-cli >/dev/null || {
        echo "redis-server and redis-cli are required" >&2; exit 1; }
    mkdir -p "$dir"
    for port in "${ports[@]}"; do
        if redis-cli -p "$port" ping >/dev/null 2>&1; then
            echo "port $port is already in use" >&2; exit 1
        fi
        mkdir -p "$dir/$port"
        redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
            --cluster-config-file nodes.conf --save "" --appendonly no \
            --dir "$dir/$port" --logfile redis.log --daemonize yes \
            --pidfile "$dir/$port/redis.pid"
    done
    for port in "${ports[@]}"; do
        for _ in $(seq 100); do
            redis-cli -p "$port" ping >/dev/null 2>&1 && break
            sleep 0.05
        done
    done
    redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >"$dir/create.log"
    for port in "${ports[@]}"; do
        for i in $(seq 200); do
            redis-cli -p "$port" cluster info | grep -q 'cluster_state:ok' && break
            [ "$i" -eq 200 ] && { echo "cluster_state not ok on $port" >&2; exit 1; }
            sleep 0.05
        done
    done
    for port in "${ports[@]}"; do echo "redis://127.0.0.1:$port"; done
}

stop() {
    for port in "${ports[@]}"; do
        pidfile="$dir/$port/redis.pid"
        if [ -f "$pidfile" ]; then
            kill "$(cat "$pidfile")" 2>/dev/null || true
        fi
    done
    for port in "${ports[@]}"; do
        pidfile="$dir/$port/redis.pid"
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    done
    rm -rf "$dir"
}

case "$action" in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
