# shellcheck shell=bash
# ---------------------------------------------------------------------------
# Helpers shared by the drove OpenNebula drivers (datastore/drove/* and
# tm/drove/*). Sourced, never run. Every function that fails prints one line on
# stderr (OpenNebula shows a driver's stderr as the error) and exits non-zero.
#
# Names used in the cluster (PREFIX is DROVE_NAME_PREFIX, "one" by default):
#   PREFIX-IMAGEID                   an image of the datastore (SOURCE drove:PREFIX-IMAGEID)
#   PREFIX-IMAGEID.base-N            read-only snapshot of that image that clones are made of
#   PREFIX-IMAGEID-VMID-DISKID       a VM's copy-on-write clone of a non-persistent image
#   PREFIX-sys-VMID-DISKID           a VM's volatile disk (mkimage)
#   DISKVDI.snap-SNAPID              OpenNebula disk snapshot SNAPID of DISKVDI
# ---------------------------------------------------------------------------

shopt -s inherit_errexit

SCRIPT_NAME=${SCRIPT_NAME:-$(basename "$0")}
DRIVER_KIND=${DRIVER_KIND:-$(basename "$(dirname "$(dirname "$(readlink -f "$0")")")")}

# Print an error on stderr and exit 1.
drove_die() {
    echo "ERROR: drove ${DRIVER_KIND}/${SCRIPT_NAME}: $*" >&2
    exit 1
}

# An informational line on stderr (OpenNebula logs a driver's stderr).
drove_log() {
    echo "INFO: drove ${DRIVER_KIND}/${SCRIPT_NAME}: $*" >&2
}

# Load drove.conf: $DROVE_CONF, else <remotes>/etc/datastore/drove/drove.conf
# relative to the driver (the layout of /var/lib/one/remotes and of this repo).
# Variables already set in the environment win over the file.
drove_load_conf() {
    local driver_path conf
    driver_path=$(dirname "$(readlink -f "$0")")
    conf=${DROVE_CONF:-$driver_path/../../etc/datastore/drove/drove.conf}
    if [ -f "$conf" ]; then
        # shellcheck source=SCRIPTDIR/../etc/datastore/drove/drove.conf
        . "$conf"
    elif [ -n "${DROVE_CONF:-}" ]; then
        drove_die "configuration file $DROVE_CONF (DROVE_CONF) does not exist"
    fi
    : "${DROVE:=drove}"
    : "${DROVE_NAME_PREFIX:=one}"
    : "${DROVE_NBD_SOCKET:=/var/lib/drove/nbd.sock}"
    : "${DROVE_NBD_TCP:=}"
    : "${DROVE_NBD_RECONNECT_DELAY:=30}"
    # Checked before any script acts: it ends up in libvirt XML on the hypervisor.
    case $DROVE_NBD_RECONNECT_DELAY in
    '' | *[!0-9]* | ??????????*) drove_die "DROVE_NBD_RECONNECT_DELAY must be a whole number of seconds (at most 9 digits, as the deploy filter takes), not '$DROVE_NBD_RECONNECT_DELAY'" ;;
    esac
    : "${DROVE_EPHEMERAL_CLONES:=no}"
    : "${DROVE_COPIES:=}"
    : "${DROVE_SSH:=ssh}"
    : "${DROVE_LOCAL_HOSTS:=}"
    : "${DROVE_STAGING_DIR:=/var/tmp}"
    : "${DROVE_CA:=}"
    : "${DROVE_TOKEN_FILE:=}"
    # Handed to the CLI only when set: an empty one would name no file.
    if [ -n "$DROVE_CA" ]; then export DROVE_CA; else unset DROVE_CA; fi
    if [ -n "$DROVE_TOKEN_FILE" ]; then export DROVE_TOKEN_FILE; else unset DROVE_TOKEN_FILE; fi
    if ! command -v "$DROVE" >/dev/null 2>&1; then
        drove_die "the drove CLI '$DROVE' is not installed or not on PATH (set DROVE in drove.conf)"
    fi
    command -v python3 >/dev/null 2>&1 || drove_die "python3 is required"
    export DROVE_CLUSTER
}

# ---- arguments --------------------------------------------------------------

# host:path -> host (like OpenNebula's arg_host: up to the first ':').
drove_arg_host() {
    case "$1" in
        *:*) echo "${1%%:*}" ;;
        *) echo "" ;;
    esac
}

# host:path -> path (everything after the first ':', repeated slashes folded).
drove_arg_path() {
    local p=$1
    case "$p" in *:*) p=${p#*:} ;; esac
    echo "$p" | tr -s /
}

# Check a VDI name the way drove does: 1..128 of [A-Za-z0-9._-], not
# starting with '.' or '-'.
drove_check_name() {
    if ! [[ "$1" =~ ^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$ ]]; then
        drove_die "'$1' is not a valid drove VDI name"
    fi
}

# An image SOURCE ("drove:NAME", optionally as "host:drove:NAME") -> NAME.
drove_source_vdi() {
    local s=$1 name
    case "$s" in
        drove:*) name=${s#drove:} ;;
        *:drove:*) name=${s#*:drove:} ;;
        *) drove_die "'$s' is not a drove image SOURCE (expected drove:NAME)" ;;
    esac
    drove_check_name "$name"
    echo "$name"
}

# A VM disk path ".../VMID/disk.N" -> N.
drove_disk_id() {
    if [[ "$1" =~ /disk\.([0-9]+)$ ]]; then
        echo "${BASH_REMATCH[1]}"
    else
        drove_die "'$1' is not a VM disk path (expected .../disk.N)"
    fi
}

# Check that $2 is a non-negative integer; $1 names it in the message.
drove_check_int() {
    [[ "$2" =~ ^[0-9]+$ ]] || drove_die "$1 must be a non-negative integer, got '$2'"
}

# ---- the DRIVER_ACTION document ------------------------------------------------

# Read the base64 DRIVER_ACTION from stdin into DRV_ACTION and check it decodes to
# an XML document whose root is $1 (DS_DRIVER_ACTION_DATA).
drove_read_action() {
    local root=$1 err
    DRV_ACTION=$(cat -)
    [ -n "$DRV_ACTION" ] || drove_die "no DRIVER_ACTION on stdin (base64 XML expected)"
    if ! err=$(drove_xpath "$DRV_ACTION" "/$root" 2>&1 >/dev/null); then
        drove_die "bad DRIVER_ACTION on stdin: $err"
    fi
}

# drove_xpath B64 PATH... : print the text of each absolute PATH in the base64
# XML document B64, each followed by a NUL (empty when missing), in the manner of
# OpenNebula's xpath.rb -b. Predicates as ElementTree knows them work
# (/VM/TEMPLATE/DISK[DISK_ID='0']/SOURCE). Exit 1 when B64 is not base64 XML.
drove_xpath() {
    python3 - "$@" <<'PY'
import base64, binascii, sys
import xml.etree.ElementTree as ET
b64, paths = sys.argv[1], sys.argv[2:]
try:
    doc = ET.fromstring(base64.b64decode(b64.strip(), validate=False))
except (binascii.Error, ValueError, ET.ParseError) as e:
    sys.stderr.write("not base64-encoded XML (%s)\n" % e)
    sys.exit(1)
out = []
for p in paths:
    parts = p.strip("/").split("/", 1)
    if parts[0] != doc.tag:
        if len(paths) == 1 and len(parts) == 1:
            sys.stderr.write("root element is <%s>, expected <%s>\n" % (doc.tag, parts[0]))
            sys.exit(1)
        out.append("")
        continue
    el = doc if len(parts) == 1 else doc.find(parts[1])
    out.append("" if el is None else "".join(el.itertext()).strip())
sys.stdout.write("".join(v + "\0" for v in out))
PY
}

# drove_xpath_vars B64 VAR=PATH... : set each shell variable VAR to the text at PATH.
drove_xpath_vars() {
    local b64=$1 i=0 var
    shift
    local -a vars=() paths=() vals=()
    for a in "$@"; do
        vars+=("${a%%=*}")
        paths+=("${a#*=}")
    done
    while IFS= read -r -d '' v; do vals+=("$v"); done < <(drove_xpath "$b64" "${paths[@]}")
    for var in "${vars[@]}"; do
        printf -v "$var" '%s' "${vals[$i]:-}"
        i=$((i + 1))
    done
}

# ---- the drove CLI ------------------------------------------------------------

# Run the drove CLI; on failure exit with "WHAT: <what drove said>".
# drove_run WHAT ARGS...
drove_run() {
    local what=$1 out rc
    shift
    rc=0
    out=$("$DROVE" "$@" 2>&1) || rc=$?
    if [ "$rc" -ne 0 ]; then
        drove_die "$what: $(echo "$out" | tail -n 5 | tr '\n' ' ')(drove $*, exit $rc)"
    fi
    [ -z "$out" ] || echo "$out" >&2
}

# Print the --json output of a drove command; on failure exit with its message.
# drove_json WHAT ARGS...
drove_json() {
    local what=$1 out rc
    shift
    rc=0
    out=$("$DROVE" "$@" --json 2>/dev/null) || rc=$?
    if [ "$rc" -ne 0 ]; then
        drove_die "$what: $(drove_json_error "$out") (drove $*, exit $rc)"
    fi
    echo "$out"
}

# The message of a {"error": {...}} document (or the text itself).
drove_json_error() {
    python3 -c '
import json, sys
t = sys.argv[1]
try:
    e = json.loads(t)["error"]
    print("%s (%s)" % (e.get("message"), e.get("kind")))
except Exception:
    print(t.strip().replace("\n", " ") or "no output")' "$1"
}

# Print the `drove vdi info NAME --json` document, or nothing when NAME does not
# exist (exit 0 in both cases); any other failure (cluster unreachable) exits.
drove_vdi_info() {
    local out rc kind
    rc=0
    out=$("$DROVE" vdi info "$1" --json 2>/dev/null) || rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "$out"
        return 0
    fi
    kind=$(python3 -c '
import json, sys
try:
    print(json.loads(sys.argv[1])["error"]["kind"])
except Exception:
    print("")' "$out")
    [ "$kind" = "not_found" ] && return 0
    drove_die "cannot look up VDI $1: $(drove_json_error "$out") (exit $rc)"
}

drove_vdi_exists() {
    local info
    info=$(drove_vdi_info "$1") || exit 1
    [ -n "$info" ]
}

# Print field $2 (a dotted path) of the JSON document $1; empty when absent.
drove_json_field() {
    python3 -c '
import json, sys
v = json.loads(sys.argv[1])
for k in sys.argv[2].split("."):
    v = v.get(k) if isinstance(v, dict) else None
print("" if v is None else (str(v).lower() if isinstance(v, bool) else v))' "$1" "$2"
}

# Questions about the VDI table (`drove vdi list --json`):
#   drove_list parent NAME    the name of NAME's parent snapshot (nothing if none)
#   drove_list children NAME  the VDIs and snapshots made from snapshot NAME
#   drove_list match REGEX    the names matching the Python regular expression
drove_list() {
    local list
    list=$(drove_json "cannot list VDIs" vdi list) || exit 1
    python3 -c '
import json, re, sys
vdis = json.loads(sys.argv[1])
mode, arg = sys.argv[2], sys.argv[3]
by_id = {v["id"]: v for v in vdis}
me = next((v for v in vdis if v["name"] == arg), None)
for v in vdis:
    if mode == "match" and re.fullmatch(arg, v["name"]):
        print(v["name"])
    elif mode == "children" and me is not None and v.get("parent") == me["id"]:
        print(v["name"])
if mode == "parent" and me is not None and me.get("parent") in by_id:
    print(by_id[me["parent"]]["name"])' "$list" "$1" "$2"
}

# Size arguments for new VDIs.
drove_copies_args() {
    if [ -n "$DROVE_COPIES" ]; then
        echo "--copies $DROVE_COPIES"
    fi
}

# The read-only snapshot of image VDI $1 that clones are made from, taken now
# unless the image is unchanged since its newest one (its parent is such a
# snapshot and it has written nothing of its own since). Prints the name.
drove_image_base() {
    local img=$1 info parent own n
    info=$(drove_vdi_info "$img") || exit 1
    [ -n "$info" ] || drove_die "image VDI $img does not exist"
    parent=$(drove_list parent "$img") || exit 1
    if [[ "$parent" == "$img".base-* ]]; then
        own=$(drove_own_objects "$img") || exit 1
        if [ "$own" = "0" ]; then
            echo "$parent"
            return 0
        fi
    fi
    n=$(date +%s%N)
    drove_run "cannot snapshot image $img" vdi snapshot "$img" "$img.base-$n"
    echo "$img.base-$n"
}

# Objects VDI $1 stores itself (not counting what it reads from parents), over
# all replicas; -1 when unknown.
drove_own_objects() {
    local du
    du=$(drove_json "cannot measure $1" vdi du "$1") || exit 1
    python3 -c '
import json, sys
for r in json.loads(sys.argv[1]):
    if r.get("name") == sys.argv[2]:
        print(int(r.get("objects", -1))); sys.exit(0)
print(-1)' "$du" "$1"
}

# Delete VDI $1 (no error when it does not exist). Extra arguments go to delete.
drove_delete_if_exists() {
    local name=$1
    shift
    if drove_vdi_exists "$name"; then
        drove_run "cannot delete $name" vdi delete "$name" "$@"
    fi
}

# ---- the disk's NBD location ---------------------------------------------------

# The NBD URI of VDI $1 on a hypervisor (its local node).
drove_nbd_uri() {
    if [ -n "$DROVE_NBD_TCP" ]; then
        echo "nbd://$DROVE_NBD_TCP/$1"
    else
        echo "nbd+unix:///$1?socket=$DROVE_NBD_SOCKET"
    fi
}

# Run the bash script $2 on host $1: here when $1 is this host (localhost, its
# name or a name in DROVE_LOCAL_HOSTS), else through $DROVE_SSH.
drove_host_exec() {
    local host=$1 script=$2 h
    local -a local_names=(localhost 127.0.0.1 "$(hostname 2>/dev/null)" "$(hostname -f 2>/dev/null)")
    # shellcheck disable=SC2206
    local_names+=($DROVE_LOCAL_HOSTS)
    for h in "${local_names[@]}"; do
        if [ -n "$h" ] && [ "$host" = "$h" ]; then
            bash -c "$script"
            return
        fi
    done
    $DROVE_SSH "$host" bash -s <<<"$script"
}

# Write the marker DISKPATH.drove on HOST saying which VDI backs disk DISKPATH.
# drove_write_marker HOST DISKPATH VDI
drove_write_marker() {
    local host=$1 path=$2 vdi=$3 uri
    uri=$(drove_nbd_uri "$vdi")
    drove_host_exec "$host" "set -e
mkdir -p $(printf %q "$(dirname "$path")")
rm -f $(printf %q "$path")
cat > $(printf %q "$path.drove") <<'EOF'
DROVE_VDI=$vdi
DROVE_NBD_URI=$uri
DROVE_NBD_RECONNECT_DELAY=$DROVE_NBD_RECONNECT_DELAY
EOF" || drove_die "cannot write $host:$path.drove"
}

# The VDI named in the marker of DISKPATH on HOST, or nothing.
drove_read_marker() {
    local host=$1 path=$2
    drove_host_exec "$host" "test -f $(printf %q "$path.drove") && sed -n 's/^DROVE_VDI=//p' $(printf %q "$path.drove") || true"
}

# The VDI behind disk DISKPATH of VM VMID on HOST: the marker, else the names the
# drivers give (clone PREFIX-IMG-VMID-DISK, volatile PREFIX-sys-VMID-DISK).
# Prints nothing when none exists.
drove_disk_vdi() {
    local host=$1 path=$2 vmid=$3 disk vdi
    disk=$(drove_disk_id "$path")
    vdi=$(drove_read_marker "$host" "$path") || exit 1
    if [ -n "$vdi" ]; then
        echo "$vdi"
        return 0
    fi
    vdi=$(drove_list match "${DROVE_NAME_PREFIX}-(sys|[0-9]+)-${vmid}-${disk}") || exit 1
    echo "$vdi" | head -n 1
}

# Delete snapshot $1, then its parents up the chain, while each is one of the
# drivers' snapshots (PREFIX-*.base-N, PREFIX-*.snap-N) that nothing is made from
# any more.
drove_prune_snapshots() {
    local p=$1 next kids
    while [ -n "$p" ] && [[ "$p" =~ ^${DROVE_NAME_PREFIX}-.*\.(base|snap)-[0-9]+$ ]]; do
        kids=$(drove_list children "$p") || exit 1
        [ -z "$kids" ] || return 0
        next=$(drove_list parent "$p") || exit 1
        drove_log "deleting snapshot $p (nothing is made from it any more)"
        drove_run "cannot delete snapshot $p" vdi delete "$p"
        p=$next
    done
}

# Split a TM "host:path" argument ($2, named $1 in messages) into HOST and DPATH;
# the path must be absolute.
drove_split_host_path() {
    HOST=$(drove_arg_host "$2")
    DPATH=$(drove_arg_path "$2")
    [ -n "$HOST" ] || drove_die "$1 '$2' is not HOST:PATH"
    [[ "$DPATH" == /* ]] || drove_die "$1 '$2': the path must be absolute"
}

# Whether VDI $1 is one the drivers made for disk $3 of VM $2 (a clone of an
# image or a volatile disk), as opposed to a persistent image used in place.
drove_is_vm_disk() {
    [[ "$1" =~ ^${DROVE_NAME_PREFIX}-(sys|.+)-$2-$3$ ]]
}
