#!/usr/bin/env bash
# The hardware truth kit's one device command (docs/hardware.md). On any GPU node, from the repo:
#     bash bench/hardware/run.sh --out DIR            # real hardware
#     bash bench/hardware/run.sh --out DIR --sim      # the simulator + a captured nvidia-smi XML
# Installs bench/hardware/wheels/*.whl (prepare.py made them: CPython 3.12, no network needed) into
# a temporary site, puts it and the repo on PYTHONPATH, then runs bench/hardware/kit.py. Options:
#     --use-env        no wheels: use the interpreter's own packages (a venv with nvmon installed)
#     --sim [SPEC]     default SPEC hgx-h100,load=idle; the XML is ../shared/hardware/qx-h100.xml
#                      (or --smi-xml FILE); other options go to kit.py run (see its --help)
# PYTHON picks the interpreter (default python3).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
out=${OUT:-}
use_env=0
sim=""
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        --use-env) use_env=1; shift ;;
        --sim) if [ $# -gt 1 ] && [ "${2#--}" = "$2" ]; then sim=$2; shift 2; else sim="hgx-h100,load=idle"; shift; fi ;;
        *) args+=("$1"); shift ;;
    esac
done
[ -n "$out" ] || { echo "run.sh: no --out DIR (and no \$OUT)" >&2; exit 2; }
mkdir -p "$out"
site=$(mktemp -d /tmp/nvmon-kit-site.XXXXXX)
trap 'rm -rf "$site"' EXIT
install_log="$site.install.log"

if [ "$use_env" = 0 ]; then
    shopt -s nullglob
    wheels=("$here"/wheels/*.whl)
    if [ ${#wheels[@]} -eq 0 ]; then
        echo "run.sh: no wheels in $here/wheels: run bench/hardware/prepare.py first (or pass --use-env)" >&2
        exit 2
    fi
    ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$ver" != "3.12" ]; then
        echo "run.sh: the wheels are for CPython 3.12, $py is $ver: set PYTHON=python3.12 (or pass --use-env)" >&2
        exit 2
    fi
    # pip where there is one; else unpack the wheels (a plain zip: every one here is platlib/purelib).
    if ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
            "${wheels[@]}" >"$install_log" 2>&1; then
        echo "pip install failed (see below); unpacking the wheels instead" >>"$install_log"
        "$py" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
            "$site" "${wheels[@]}" >>"$install_log" 2>&1 || { cat "$install_log" >&2; exit 3; }
    fi
    echo "installed ${#wheels[@]} wheels into $site" >>"$install_log"
    export PYTHONPATH="$site:$repo"
else
    export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
fi

if [ -n "$sim" ]; then
    xml="$repo/../shared/hardware/qx-h100.xml"
    [ -f "$xml" ] || xml="$repo/shared/hardware/qx-h100.xml"
    case " ${args[*]-} " in *" --smi-xml "*) ;; *) args+=(--smi-xml "$xml") ;; esac
    args+=(--sim "$sim")
elif ! ldconfig -p 2>/dev/null | grep 'libnvidia-ml\.so\.1' >/dev/null; then  # not -q: an early exit fails the pipe
    # pynvml loads libnvidia-ml.so.1 by name: where the loader's cache lacks it, say where it is.
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
        if [ -e "$d/libnvidia-ml.so.1" ]; then
            export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            echo "libnvidia-ml.so.1 not in the loader cache: LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$install_log"
            break
        fi
    done
fi
"$py" "$here/kit.py" run --out "$out" --install-log "$install_log" ${args[@]+"${args[@]}"}
status=$?
rm -f "$install_log"
exit $status
