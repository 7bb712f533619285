#!/bin/bash
# deploy/slurm/dataplane.sbatch on a real one-node Slurm (CTest test_slurm):
#   test_slurm.sh BUILD_DIR
# Everything lives in one temporary directory: munged with its own key and
# socket, slurmctld and slurmd with their own slurm.conf (SLURM_CONF), state,
# spool, pid and log files and free ports, and an etcd. Then:
#   1. a job of dataplane.sbatch with 2 units (2 tasks on the node) whose
#      client step puts 3 random files as rows and gets them back; the test
#      compares them byte for byte; when the job ends the records are gone;
#   2. a second job whose client step just waits: both units up in the
#      registry, then `scancel` of the job, after which the records and the
#      unit processes must go (within 10 s; the lease is 30 s, so the records
#      go because the units revoke them on SIGTERM, not by running out).
# Exit 0 passed, 1 failed, 77 skipped: not root, a tool missing, or munged,
# slurmctld or slurmd not starting here (the reason and their logs' last
# lines are printed). Nothing outside the directory is touched (/etc/slurm,
# /etc/munge, the machine's own daemons); every process the test started is
# stopped and the directory removed on every exit path.
# DP_SLURM_TEST_KEEP=1 keeps the directory for a look afterwards.
set -euo pipefail

build=${1:?usage: test_slurm.sh BUILD_DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sbatch_script=$(cd "$here/../.." && pwd)/deploy/slurm/dataplane.sbatch
t_start=$SECONDS

say() { echo "test_slurm: [$((SECONDS - t_start))s] $*"; }
skip() { echo "test_slurm: SKIPPED: $*"; exit 77; }
fail() { echo "test_slurm: FAILED: $*" >&2; exit 1; }
# Show the last lines of each log file given.
tails() {
    local f
    for f in "$@"; do
        [ -s "$f" ] || { echo "---- $f: empty or missing" >&2; continue; }
        echo "---- last lines of $f:" >&2
        tail -n "${TAIL_LINES:-15}" "$f" >&2
    done
}

[ "$(id -u)" = 0 ] || skip "not root (slurmd and munged run as root here)"
for c in munged munge unmunge slurmctld slurmd sbatch srun squeue sinfo scancel scontrol \
         etcd etcdctl /usr/bin/python3; do
    command -v "$c" >/dev/null 2>&1 || skip "$c is not installed (slurm-wlm, munge, etcd-server, etcd-client)"
done
dp=$(readlink -f "$build/dataplane") || fail "no $build/dataplane: build it first"
[ -x "$dp" ] || fail "no $build/dataplane: build it first"
[ -f "$sbatch_script" ] || fail "no $sbatch_script"

keep=${DP_SLURM_TEST_KEEP:-}
# Nothing from a surrounding job or session may leak into ours.
while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(SLURM_|SBATCH_|SALLOC_|SRUN_|DP_)' || true)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dp-slurm.XXXXXX")
# munged wants every directory above its socket searchable by all.
chmod 711 "$tmp"
# Every process started here carries this variable (daemons, and through
# sbatch's environment every job process): the clean-up's last resort finds
# what is left by it.
tag="DP_SLURM_TEST_TAG=$tmp"
node=$(hostname -s)
# The node's CPUs: this machine's, but at least 2 (a unit per CPU for the 2
# units); on one CPU, slurmd reports the configured 2 (config_overrides).
ncpu=$(nproc)
overrides=
[ "$ncpu" -ge 2 ] || { ncpu=2; overrides=SlurmdParameters=config_overrides; }
pids=()      # daemons, in start order: munged slurmctld slurmd etcd
jobs_sub=()  # submitted job ids

# Alive and not a zombie.
alive() {
    local st
    [ -r "/proc/$1/stat" ] || return 1
    read -r st < "/proc/$1/stat" 2>/dev/null || return 1
    st=${st##*) }
    [ "${st%% *}" != Z ]
}
# SIGTERM, up to $2 s, then SIGKILL; reaps it when it is our child.
stop_pid() {
    local p=$1 t=$((SECONDS + ${2:-5}))
    alive "$p" || { wait "$p" 2>/dev/null || true; return 0; }
    kill -TERM "$p" 2>/dev/null || true
    while alive "$p" && [ "$SECONDS" -lt "$t" ]; do sleep 0.1; done
    alive "$p" && kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null || true
}
tagged_pids() {
    grep -lzx -- "$tag" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | grep -vx "$$" || true
}

cleanup() {
    local rc=$? p i left
    set +e
    trap - EXIT INT TERM ERR
    if [ ${#jobs_sub[@]} -gt 0 ] && alive "${pids[1]:-0}"; then
        scancel "${jobs_sub[@]}" 2>/dev/null
        i=0
        while [ -n "$(squeue --noheader 2>/dev/null)" ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i + 1)); done
    fi
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do stop_pid "${pids[$i]}" 5; done
    # Last resort: anything still carrying the tag (a stray slurmstepd, unit,
    # srun of a job Slurm could not end).
    left=$(tagged_pids)
    if [ -n "$left" ]; then
        echo "test_slurm: clean-up: killing leftover processes: ${left//$'\n'/ }" >&2
        for p in $left; do kill -KILL "$p" 2>/dev/null; done
        sleep 0.5
    fi
    if [ "$keep" = 1 ]; then
        echo "test_slurm: kept $tmp"
    else
        rm -rf "$tmp"
    fi
    exit "$rc"
}
trap cleanup EXIT
# A guardian outlives a SIGKILL of this script (a CTest timeout, a killed CI
# run), which runs no trap: once this shell is gone it ends whatever still
# carries the tag and removes the directory. Detached, and without the tag.
me=$$
setsid bash -c '
    while kill -0 "$1" 2>/dev/null; do sleep 1; done
    for p in $(grep -lzx -- "$2" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
        kill -KILL "$p" 2>/dev/null
    done
    [ "$3" = 1 ] || rm -rf "$4"
' guardian "$me" "$tag" "$keep" "$tmp" </dev/null >/dev/null 2>&1 &
trap 'echo "test_slurm: interrupted (SIGINT)" >&2; exit 130' INT
trap 'echo "test_slurm: interrupted (SIGTERM)" >&2; exit 143' TERM
trap 'echo "test_slurm: FAILED: line $LINENO: a command failed (status $?)" >&2; exit 1' ERR

# Four free loopback ports: slurmctld, slurmd, etcd's client and peer ports.
read -r p_ctld p_slurmd p_etcd p_peer < <(/usr/bin/python3 -c '
import socket
s = [socket.socket() for _ in range(4)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')

# --- munge ------------------------------------------------------------------
say "starting munged (own key, socket and pid file in $tmp/munge)"
mkdir -m 755 "$tmp/munge"
sock=$tmp/munge/munge.socket
head -c 1024 /dev/urandom > "$tmp/munge/munge.key"
chmod 400 "$tmp/munge/munge.key"
env "$tag" munged --foreground --socket="$sock" --key-file="$tmp/munge/munge.key" \
    --pid-file="$tmp/munge/munged.pid" --log-file="$tmp/munge/munged.log" \
    --seed-file="$tmp/munge/munged.seed" > "$tmp/munge/munged.out" 2>&1 &
pids+=($!)
deadline=$((SECONDS + 10))
until munge --socket="$sock" --no-input 2>/dev/null | unmunge --socket="$sock" >/dev/null 2>&1; do
    if ! alive "${pids[0]}" || [ "$SECONDS" -ge "$deadline" ]; then
        tails "$tmp/munge/munged.out" "$tmp/munge/munged.log"
        skip "munged does not start here (its log above)"
    fi
    sleep 0.1
done

# --- slurm ------------------------------------------------------------------
mkdir -p "$tmp/state" "$tmp/spool" "$tmp/log"
export SLURM_CONF=$tmp/slurm.conf
: > "$tmp/plugstack.conf"
cat > "$SLURM_CONF" <<EOF
# One node, this machine, everything under $tmp.
ClusterName=dptest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$p_ctld
SlurmdPort=$p_slurmd
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$tmp/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=5
$overrides
NodeName=$node NodeAddr=127.0.0.1 CPUs=$ncpu State=UNKNOWN
PartitionName=dp Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

say "starting slurmctld (SLURM_CONF=$SLURM_CONF, port $p_ctld)"
env "$tag" slurmctld -D -i > "$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
deadline=$((SECONDS + 20))
until scontrol ping 2>/dev/null | grep -q 'is UP'; do
    if ! alive "${pids[1]}" || [ "$SECONDS" -ge "$deadline" ]; then
        tails "$tmp/log/slurmctld.out" "$tmp/log/slurmctld.log"
        skip "slurmctld does not start here (its log above)"
    fi
    sleep 0.2
done

say "starting slurmd (node $node, $ncpu CPUs, port $p_slurmd)"
env "$tag" slurmd -D -N "$node" > "$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
deadline=$((SECONDS + 20))
until [ "$(sinfo --noheader --nodes="$node" --format=%T 2>/dev/null)" = idle ]; do
    if ! alive "${pids[2]}" || [ "$SECONDS" -ge "$deadline" ]; then
        sinfo --long --Node >&2 || true
        tails "$tmp/log/slurmd.out" "$tmp/log/slurmd.log" "$tmp/log/slurmctld.log"
        skip "slurmd does not start here, or its node does not become idle (logs above)"
    fi
    sleep 0.2
done
sinfo

# --- etcd -------------------------------------------------------------------
say "starting etcd on 127.0.0.1:$p_etcd"
mkdir "$tmp/etcd"
env "$tag" etcd --name t --data-dir "$tmp/etcd/data" \
    --listen-client-urls "http://127.0.0.1:$p_etcd" --advertise-client-urls "http://127.0.0.1:$p_etcd" \
    --listen-peer-urls "http://127.0.0.1:$p_peer" --initial-advertise-peer-urls "http://127.0.0.1:$p_peer" \
    --initial-cluster "t=http://127.0.0.1:$p_peer" \
    --logger=zap --log-outputs="$tmp/etcd/etcd.log" > "$tmp/etcd/etcd.out" 2>&1 &
pids+=($!)
deadline=$((SECONDS + 20))
until etcdctl --endpoints "127.0.0.1:$p_etcd" endpoint health >/dev/null 2>&1; do
    if ! alive "${pids[3]}" || [ "$SECONDS" -ge "$deadline" ]; then
        tails "$tmp/etcd/etcd.out" "$tmp/etcd/etcd.log"
        fail "etcd does not start (its log above)"
    fi
    sleep 0.1
done

# --- helpers for the jobs ---------------------------------------------------
# The registry's unit records of cluster $1 (keys only).
records() {
    etcdctl --endpoints "127.0.0.1:$p_etcd" get --prefix --keys-only "dataplane/$1/units/" | grep . || true
}
# Pids of the unit processes of cluster URL $1.
unit_pids() { pgrep -f -- "^$dp unit .*--registry $1( |\$)" || true; }
job_field() { scontrol show job -o "$1" 2>/dev/null | grep -o "$2=[^ ]*" | cut -d= -f2; }
job_done() {
    case "$(job_field "$1" JobState)" in
        COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|PREEMPTED|BOOT_FAIL|DEADLINE|OUT_OF_MEMORY) return 0 ;;
        *) return 1 ;;
    esac
}
job_fail() {  # $1 job id, $2 output file, $3 message
    echo "---- job $1:" >&2
    scontrol show job "$1" >&2 || true
    TAIL_LINES=60 tails "$2"
    TAIL_LINES=20 tails "$tmp/log/slurmd.log" "$tmp/log/slurmctld.log"
    fail "$3"
}
# Wait up to $3 s until the records and unit processes of cluster $1 (URL
# $2) are gone.
wait_gone() {
    local deadline=$((SECONDS + $3)) r u
    while :; do
        r=$(records "$1")
        u=$(unit_pids "$2")
        [ -z "$r$u" ] && return 0
        [ "$SECONDS" -lt "$deadline" ] || break
        sleep 0.1
    done
    [ -z "$r" ] || echo "records left in etcd: $r" >&2
    [ -z "$u" ] || { echo "unit processes left:" >&2; ps -o pid,stat,args -p "${u//$'\n'/,}" >&2 || true; }
    return 1
}
# Settings dataplane.sbatch reads, for both jobs: 2 units on the one node
# (2 tasks per node), loopback only, a 30 s lease (longer than the test
# waits for records to go).
sbatch_env=(env "$tag" DP_BIN="$dp" DP_ETCD="127.0.0.1:$p_etcd" DP_SLAB=16M DP_BIND=127.0.0.1
            DP_EXTRA="--registry-ttl 30" DP_UP_TIMEOUT=60 DP_STOP_TIMEOUT=10)
sbatch_opts=(--parsable --nodes=1 --ntasks-per-node=2 --chdir="$tmp")

# --- job 1: put and get through the units -----------------------------------
name1="dp-slurm-test-1"
url1=etcd://127.0.0.1:$p_etcd/$name1
mkdir "$tmp/data"
sizes=(1024 300001 1048576)
for i in 0 1 2; do head -c "${sizes[$i]}" /dev/urandom > "$tmp/data/in.$i"; done
# The client step: DP_CLUSTER comes from dataplane.sbatch.
cat > "$tmp/client.sh" <<'EOF'
#!/bin/bash
set -euo pipefail
dp=$1 d=$2
echo "client: DP_CLUSTER=$DP_CLUSTER"
"$dp" cluster
for i in 0 1 2; do "$dp" put --row $((3 + i)) --field x --file "$d/in.$i"; done
for i in 0 1 2; do "$dp" get "$((3 + i))@x" -o "$d/out.$i"; done
echo "client: done"
EOF
say "job 1: sbatch $sbatch_script (2 units, cluster $name1), client step puts and gets 3 rows"
job1=$("${sbatch_env[@]}" DP_CLUSTER_NAME="$name1" sbatch "${sbatch_opts[@]}" \
       --job-name=dp-test-1 --output="$tmp/job1.out" "$sbatch_script" \
       bash "$tmp/client.sh" "$dp" "$tmp/data")
jobs_sub+=("$job1")
deadline=$((SECONDS + 90))
until job_done "$job1"; do
    [ "$SECONDS" -lt "$deadline" ] || job_fail "$job1" "$tmp/job1.out" "job 1 did not end within 90 s"
    sleep 0.2
done
state=$(job_field "$job1" JobState) ec=$(job_field "$job1" ExitCode)
say "job 1 ended: $state, exit code $ec"
if [ "$state" != COMPLETED ] || [ "$ec" != 0:0 ]; then
    job_fail "$job1" "$tmp/job1.out" "job 1 ended $state (exit code $ec), not COMPLETED 0:0"
fi
grep -q "2 units up" "$tmp/job1.out" ||
    job_fail "$job1" "$tmp/job1.out" "job 1's output does not say that its 2 units were up"
for i in 0 1 2; do
    [ -f "$tmp/data/out.$i" ] || job_fail "$job1" "$tmp/job1.out" "row $((3 + i)) was not got back"
    cmp "$tmp/data/in.$i" "$tmp/data/out.$i" ||
        fail "row $((3 + i)): what get returned differs from what was put (${sizes[$i]} bytes)"
done
say "the 3 rows came back byte for byte ($(cd "$tmp/data" && sha256sum out.* | cut -c1-12 | tr '\n' ' '))"
wait_gone "$name1" "$url1" 10 ||
    job_fail "$job1" "$tmp/job1.out" "job 1 ended but its records or units are still there"
say "job 1's units and their records are gone"

# --- job 2: scancel -----------------------------------------------------------
say "job 2: sbatch $sbatch_script (2 units, default cluster name), client step waits"
# shellcheck disable=SC2016 # $1 is the inner shell's
job2=$("${sbatch_env[@]}" sbatch "${sbatch_opts[@]}" --job-name=dp-test-2 \
       --output="$tmp/job2.out" "$sbatch_script" \
       bash -c 'touch "$1"; exec sleep 600' client "$tmp/job2.ready")
jobs_sub+=("$job2")
name2=dp-$job2
url2=etcd://127.0.0.1:$p_etcd/$name2
deadline=$((SECONDS + 60))
until [ -e "$tmp/job2.ready" ]; do
    job_done "$job2" && job_fail "$job2" "$tmp/job2.out" "job 2 ended before its client step ran"
    [ "$SECONDS" -lt "$deadline" ] || job_fail "$job2" "$tmp/job2.out" "job 2's client step did not start within 60 s"
    sleep 0.2
done
"$dp" cluster --cluster "$url2" || job_fail "$job2" "$tmp/job2.out" "not every unit of job 2 is up"
n=$(records "$name2" | wc -l) u=$(unit_pids "$url2" | wc -l)
if [ "$n" != 2 ] || [ "$u" != 2 ]; then
    job_fail "$job2" "$tmp/job2.out" "job 2: $n records and $u unit processes, not 2 and 2"
fi
say "job 2: 2 units up ($name2); scancel $job2"
scancel "$job2"
wait_gone "$name2" "$url2" 10 ||
    job_fail "$job2" "$tmp/job2.out" "after scancel, records or units of job 2 stayed for 10 s"
say "job 2's units and their records are gone"
deadline=$((SECONDS + 20))
until job_done "$job2"; do
    [ "$SECONDS" -lt "$deadline" ] || job_fail "$job2" "$tmp/job2.out" "job 2 did not end within 20 s of scancel"
    sleep 0.2
done
say "job 2 ended: $(job_field "$job2" JobState)"
if [ "$(grep -c "signal 15: stopping" "$tmp/job2.out")" -lt 2 ]; then
    job_fail "$job2" "$tmp/job2.out" "job 2's units did not both say they stopped on SIGTERM"
fi

say "passed"
