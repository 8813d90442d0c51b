#!/usr/bin/env bash
# verbsnet stock-NCCL GPU check (docs/gpu-check.md).
#
# Run from the repository root on a machine with one NVIDIA GPU, nvcc, python3 with PyTorch
# and the nvidia-nccl-cu13 (or -cu12) wheel, after `cargo build --release` put the plugin at
# target/release/libnccl_net_verbsnet.so:
#
#     bash testharness/gpu/run-gpu-check.sh               # the whole check, about 1-4 minutes
#     bash testharness/gpu/run-gpu-check.sh --preflight   # what can be checked without a GPU
#
# Steps: preflight, build allreduce_check.cu with nvcc against the wheel's nccl.h and
# libnccl.so.2, run two ranks on GPU 0 with different NCCL_HOSTID through verbsnet
# (NCCL_NET=verbsnet, VERBSNET_TRANSPORT=tcp) and assert from NCCL's own log that the plugin
# was loaded and every channel went through it and that no result was wrong; the PyTorch
# variant (torch.distributed, NCCL backend, two spawned processes) through verbsnet; then
# the same C sweep through NCCL's built-in Socket transport as the baseline (busbw ratio
# ours/theirs per size). Each step runs even when an earlier one failed.
#
# Output goes to $OUT (default ./gpu-out): summary.txt (verdict, reasons, tables, ratio),
# check.log (this script's trace and the build), nccl-verbsnet.log, nccl-socket.log and
# torch-verbsnet.log (both ranks' output, NCCL_DEBUG=INFO). Exit status 0 only if every
# step passed; otherwise the reasons are printed and written to summary.txt.
#
# Options:
#   --preflight    check tools, wheel, plugin .so (no GPU needed), print what is missing
#   --build-only   preflight, then build the test program, then stop
#   --skip-socket  do not run the Socket baseline
#   --skip-torch   do not run the PyTorch variant
#   -h, --help     this text
# Environment (all optional):
#   OUT                        output folder (default ./gpu-out)
#   PYTHON                     python with torch and the NCCL wheel (default python3)
#   NVCC                       nvcc to use (default: PATH, then $CUDA_HOME/bin, /usr/local/cuda/bin)
#   VERBSNET_NVCC_FLAGS        extra nvcc arguments, split on spaces (e.g. "-ccbin g++-12")
#   VERBSNET_NCCL_HOME         folder with include/nccl.h and lib/libnccl.so.2 (default: the wheel)
#   VERBSNET_PLUGIN_SO         the plugin (default target/release/libnccl_net_verbsnet.so)
#   VERBSNET_GPU_MAX_BYTES     largest all_reduce (default 256M)
#   VERBSNET_GPU_ITER_BUDGET   bytes of timed all_reduce per size: iterations = this / size,
#                              clamped to 2..20 (default 512M)
#   VERBSNET_GPU_NCHANNELS     NCCL_MAX_NCHANNELS for the runs (default 2)
#   VERBSNET_GPU_RUN_TIMEOUT   seconds for one two-rank run (default 100)
#   VERBSNET_GPU_SIZE_TIMEOUT  seconds one size may take inside allreduce_check (default 60)
#   VERBSNET_GPU_BUDGET_S      seconds for the whole check; steps are cut to fit (default 285)
#   VERBSNET_GPU_IFNAME        interface for NCCL's sockets and bootstrap (default lo)
#   VERBSNET_GPU_KEEP_WORK=1   keep the scratch folder (build, per-rank logs)
#   VERBSNET_GPU_FAKE=1        self-test only (selftest.sh): build with gcc against
#                              fake_nccl.h instead of nvcc + NCCL, no GPU, no PyTorch step;
#                              the summary is marked FAKE and proves nothing about NCCL
#
# The functions vn_check_nccl_log and vn_version_ge are also sourced by selftest.sh, which
# runs them against sample logs; sourcing this file runs nothing else.

# ------------------------------------------------------------------------------------------
# Log assertions (pure functions of a log file; tested by selftest.sh)
# ------------------------------------------------------------------------------------------

# vn_version_ge A B: true when version A >= version B (dotted numbers).
vn_version_ge() {
    [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]
}

# vn_nccl_version_from_log FILE: prints the NCCL version NCCL logged ("NCCL version 2.32.3+...").
vn_nccl_version_from_log() {
    grep -m1 -oE 'NCCL version [0-9]+\.[0-9]+\.[0-9]+' "$1" 2>/dev/null | awk '{print $3}'
}

# vn_check_nccl_log FILE NET [NCCL_VERSION] [EXTERNAL]
#   Asserts from NCCL's INFO log of one rank that the network NET carried the job:
#   - "Using network NET" (every NCCL version) and no "Using network <other>";
#   - at least one "[send] via NET/NET/<dev>" and one "[receive] via NET/NET/<dev>" channel
#     line, and no channel connected any other way (P2P, SHM, another net);
#   - EXTERNAL=1 (an external plugin): a line saying NCCL loaded it: "NET/Plugin: Loaded net
#     plugin NET (vN)" (2.26+ always; older only through a compatibility shim), "Successfully
#     loaded external network plugin <path>" (2.28+), "Initialized NET plugin NET" /
#     "Assigned NET plugin NET to comm" (2.27+). Required when NCCL_VERSION >= 2.26 or unknown;
#     on older versions a missing one is only noted (they print none for a native v8 load);
#   - none of the lines NCCL prints when a plugin failed, was not found, fell back, or the
#     two ranks were seen as one host (duplicate GPU), and no WARN naming NET.
#   Prints "ok: ..." / "FAIL: ..." / "note: ..." lines; returns 0 when nothing failed.
vn_check_nccl_log() {
    local file="$1" net="$2" version="${3:-}" external="${4:-1}"
    local fails=0 line
    local netre="${net//./\\.}"
    if [[ ! -s "$file" ]]; then
        echo "FAIL: log $file is missing or empty"
        return 1
    fi
    if [[ -z "$version" ]]; then
        version="$(vn_nccl_version_from_log "$file")"
    fi

    # Lines that prove a failure or a fallback, whatever else the log says.
    local -a bad_patterns=(
        "Failed to initialize NET plugin ${netre}([^[:alnum:]_]|$)"
        'Failed to initialize any NET plugin'
        'Error: network .* not found'
        'Duplicate GPU detected'
        'Multiple Ranks are using the same GPU'
        'No transport found for rank'
    )
    if [[ "$external" == 1 ]]; then
        # Only when we asked for an external plugin: without one, NCCL before 2.28 looks for
        # libnccl-net.so and harmlessly logs that it is not there.
        bad_patterns+=(
            'External network plugin .* is unsupported'
            'NET/Plugin: Could not find'
            'NET/Plugin ?: Plugin load .*returned'
        )
    fi
    local pat
    for pat in "${bad_patterns[@]}"; do
        line="$(grep -m1 -E "$pat" "$file")"
        if [[ -n "$line" ]]; then
            echo "FAIL: NCCL reported: ${line}"
            fails=$((fails + 1))
        fi
    done

    # "Using network X": must be NET, never another.
    if grep -qE "Using network ${netre}([^[:alnum:]_]|$)" "$file"; then
        echo "ok: NCCL says: Using network ${net}"
    else
        echo "FAIL: no 'Using network ${net}' line: NCCL did not pick ${net}"
        fails=$((fails + 1))
    fi
    line="$(grep -E 'Using network [[:alnum:]_]+' "$file" | grep -vE "Using network ${netre}([^[:alnum:]_]|$)" | head -n1)"
    if [[ -n "$line" ]]; then
        echo "FAIL: NCCL used another network: ${line}"
        fails=$((fails + 1))
    fi

    # Channel connections: all through NET/<net>/<dev>, both directions present.
    local nsend nrecv
    nsend="$(grep -cE "\[send\] via NET/${netre}/[0-9]+" "$file")"
    nrecv="$(grep -cE "\[receive\] via NET/${netre}/[0-9]+" "$file")"
    if [[ "$nsend" -gt 0 && "$nrecv" -gt 0 ]]; then
        echo "ok: ${nsend} send and ${nrecv} receive channel connections via NET/${net}"
    else
        echo "FAIL: expected channel lines '[send] via NET/${net}/N' and '[receive] via NET/${net}/N', found ${nsend} send and ${nrecv} receive"
        fails=$((fails + 1))
    fi
    line="$(grep -E 'Channel [0-9]+/[0-9]+ : .* via ' "$file" | grep -vE " via NET/${netre}/[0-9]+" | head -n1)"
    if [[ -n "$line" ]]; then
        echo "FAIL: a channel did not go through NET/${net}: ${line}"
        fails=$((fails + 1))
    fi

    # The plugin load itself (external plugins only).
    if [[ "$external" == 1 ]]; then
        local -a load_patterns=(
            "NET/Plugin: Loaded net plugin ${netre} \(v[0-9]+\)"
            "Successfully loaded external network plugin .*"
            "Initialized NET plugin ${netre}([^[:alnum:]_]|$)"
            "Assigned NET plugin ${netre} to comm"
        )
        local found=""
        for pat in "${load_patterns[@]}"; do
            line="$(grep -m1 -oE "$pat" "$file")"
            if [[ -n "$line" ]]; then
                found="$line"
                break
            fi
        done
        if [[ -n "$found" ]]; then
            echo "ok: NCCL loaded the plugin: ${found}"
        elif [[ -n "$version" ]] && ! vn_version_ge "$version" 2.26.0; then
            echo "note: no plugin-load line (NCCL ${version} prints none for a native load); 'Using network ${net}' stands as the proof"
        else
            echo "FAIL: no line saying NCCL loaded plugin ${net} (NCCL ${version:-version unknown})"
            fails=$((fails + 1))
        fi
    fi

    # Our own WARNs (the plugin logs as NET/<name>) fail the check; others are listed.
    line="$(grep -m1 -E "NCCL WARN .*${netre}" "$file")"
    if [[ -n "$line" ]]; then
        echo "FAIL: WARN about ${net}: ${line}"
        fails=$((fails + 1))
    fi
    while IFS= read -r line; do
        echo "note: ${line}"
    done < <(grep -E 'NCCL WARN' "$file" | grep -vE "${netre}" | sort | uniq -c | sort -rn | head -n5)
    line="$(grep -m1 -oE 'NCCL_HOSTID set by environment to .*' "$file")"
    if [[ -n "$line" ]]; then
        echo "ok: ${line}"
    fi
    [[ "$fails" -eq 0 ]]
}

# vn_check_table FILE EXPECTED_ROWS: the table rank 0 wrote: EXPECTED_ROWS data rows, every
# #wrong 0, footer "Out of bounds values : 0 OK". Prints ok/FAIL lines.
vn_check_table() {
    local file="$1" want="$2" fails=0
    if [[ ! -s "$file" ]]; then
        echo "FAIL: no result table ($file): the run did not get to print one"
        return 1
    fi
    local rows bad
    rows="$(awk '$1 ~ /^[0-9]+$/ && NF == 8 {n++} END {print n+0}' "$file")"
    bad="$(awk '$1 ~ /^[0-9]+$/ && NF == 8 && $8 != 0 {printf "%s B: %s wrong; ", $1, $8}' "$file")"
    if [[ "$rows" -ne "$want" ]]; then
        echo "FAIL: table has ${rows} sizes, expected ${want} (the run stopped early?)"
        fails=$((fails + 1))
    else
        echo "ok: table has all ${rows} sizes"
    fi
    if [[ -n "$bad" ]]; then
        echo "FAIL: wrong results: ${bad}"
        fails=$((fails + 1))
    elif ! grep -qE '^# Out of bounds values : 0 OK' "$file"; then
        echo "FAIL: table footer does not say 'Out of bounds values : 0 OK'"
        fails=$((fails + 1))
    else
        echo "ok: #wrong = 0 for every size"
    fi
    [[ "$fails" -eq 0 ]]
}

# vn_parse_bytes TEXT: prints the byte count of "256M", "4k", "1GiB", "100" (powers of 1024).
vn_parse_bytes() {
    local t="${1^^}"
    t="${t%B}"
    t="${t%I}"
    local shift=0
    case "$t" in
        *K) shift=10; t="${t%K}" ;;
        *M) shift=20; t="${t%M}" ;;
        *G) shift=30; t="${t%G}" ;;
    esac
    [[ "$t" =~ ^[0-9]{1,12}$ ]] || return 1
    echo $((10#$t << shift))
}

# vn_sweep_count MIN MAX: how many sizes MIN, 2*MIN, ... <= MAX (allreduce_check's sweep).
vn_sweep_count() {
    local s="$1" n=0
    while [[ "$s" -le "$2" ]]; do
        n=$((n + 1))
        s=$((s * 2))
    done
    echo "$n"
}

# vn_ratio_table OURS THEIRS: per size, busbw ours / theirs. Computed from the time column
# (busbw = size * const / time, so the ratio is time_theirs / time_ours), which keeps its
# precision for the small sizes where busbw rounds to 0.000.
vn_ratio_table() {
    awk '
        FNR == NR { if ($1 ~ /^[0-9]+$/ && NF == 8) { tt[$1] = $5; tb[$1] = $7 } next }
        $1 ~ /^[0-9]+$/ && NF == 8 {
            if (!header) {
                printf "#%13s %12s %12s %8s\n", "size(B)", "verbsnet", "Socket", "ratio"
                printf "#%13s %12s %12s %8s\n", "", "busbw(GB/s)", "busbw(GB/s)", "ours/them"
                header = 1
            }
            if (($1 in tt) && $5 > 0) {
                r = tt[$1] / $5
                printf " %13s %12s %12s %8.2f\n", $1, $7, tb[$1], r
                if ($1 >= 1048576) { lsum += r; ln++ }
                asum += r; an++
            } else {
                printf " %13s %12s %12s %8s\n", $1, $7, ($1 in tb) ? tb[$1] : "-", "n/a"
            }
        }
        END {
            if (an) printf "# mean ratio, all sizes: %.2f (%d sizes)\n", asum / an, an
            if (ln) printf "# mean ratio, sizes >= 1 MiB: %.2f (%d sizes)\n", lsum / ln, ln
        }
    ' "$2" "$1"
}

# ------------------------------------------------------------------------------------------
# The check
# ------------------------------------------------------------------------------------------

VN_STEPS=()      # "STATUS name: reason" lines for the summary
VN_FAILED=0
VN_PIDS=()

vn_say() { printf '%s\n' "$*" | tee -a "$VN_CHECK_LOG"; }
# vn_indent PREFIX: copies stdin to the console and check.log, each line after PREFIX.
vn_indent() {
    local l
    while IFS= read -r l; do
        vn_say "$1$l"
    done
}
vn_step() {
    # vn_step STATUS NAME REASON
    VN_STEPS+=("$(printf '%-5s %-22s %s' "$1" "$2" "$3")")
    [[ "$1" == FAIL ]] && VN_FAILED=1
    vn_say "== $1 $2${3:+: $3}"
}

vn_remaining() { echo $((VN_BUDGET - (SECONDS - VN_START))); }

# vn_timeout WANT: WANT seconds, cut to what is left of the budget (minus a margin for the
# summary); prints 0 when too little is left to be worth starting.
vn_timeout() {
    local want="$1" left
    left=$(($(vn_remaining) - 10))
    if [[ "$left" -lt 20 ]]; then
        echo 0
    elif [[ "$want" -gt "$left" ]]; then
        echo "$left"
    else
        echo "$want"
    fi
}

vn_cleanup() {
    local pid
    for pid in "${VN_PIDS[@]}"; do
        kill "$pid" 2>/dev/null
    done
    if [[ -n "${VN_WORK:-}" && -d "$VN_WORK" && "${VERBSNET_GPU_KEEP_WORK:-0}" != 1 ]]; then
        rm -rf "$VN_WORK"
    fi
}

# Keeps a file under the 16 MiB that come back from $OUT: first 2 MiB and last 12 MiB.
vn_cap_file() {
    local f="$1" max=$((15 * 1024 * 1024)) size
    [[ -f "$f" ]] || return 0
    size="$(stat -c %s "$f")"
    if [[ "$size" -gt "$max" ]]; then
        {
            head -c $((2 * 1024 * 1024)) "$f"
            printf '\n\n[... %s bytes cut by run-gpu-check.sh ...]\n\n' "$((size - 14 * 1024 * 1024))"
            tail -c $((12 * 1024 * 1024)) "$f"
        } > "$f.cap" && mv "$f.cap" "$f"
    fi
}

# Preflight. Sets VN_PYTHON VN_NVCC VN_NCCL_HOME VN_NCCL_VERSION VN_NCCL_WHEEL VN_PLUGIN.
# Each missing requirement is one "MISSING" line; returns the number missing.
vn_preflight() {
    local mode="$1" missing=0
    vn_say "-- preflight"
    vn_pf_ok() { vn_say "  ok      $*"; }
    vn_pf_warn() { vn_say "  warn    $*"; }
    vn_pf_miss() { vn_say "  MISSING $*"; missing=$((missing + 1)); }

    local tool
    for tool in timeout readelf awk sort stat mktemp ldd; do
        if command -v "$tool" >/dev/null 2>&1; then
            vn_pf_ok "$tool"
        else
            vn_pf_miss "$tool (coreutils/binutils/libc-bin)"
        fi
    done
    if [[ -d /sys/class/net/lo ]]; then
        vn_pf_ok "loopback interface lo"
    else
        vn_pf_warn "no /sys/class/net/lo: set VERBSNET_GPU_IFNAME to an interface NCCL can use"
    fi

    # python and the NCCL wheel
    VN_PYTHON="${PYTHON:-python3}"
    if ! command -v "$VN_PYTHON" >/dev/null 2>&1; then
        vn_pf_miss "python ($VN_PYTHON not found; set PYTHON)"
    else
        vn_pf_ok "python: $(command -v "$VN_PYTHON") ($("$VN_PYTHON" -c 'import sys; print(sys.version.split()[0])' 2>&1))"
    fi
    VN_NCCL_HOME="${VERBSNET_NCCL_HOME:-}"
    VN_NCCL_WHEEL=""
    VN_NCCL_VERSION=""
    VN_NVCC=""
    if [[ "$VN_FAKE" == 1 ]]; then
        vn_pf_warn "VERBSNET_GPU_FAKE=1: fake NCCL self-test; NCCL wheel, nvcc, PyTorch and GPU not checked"
        if command -v "${CC:-gcc}" >/dev/null 2>&1; then
            vn_pf_ok "C compiler ${CC:-gcc} for the fake build"
        else
            vn_pf_miss "C compiler ${CC:-gcc} for the fake build"
        fi
    else
        vn_preflight_cuda "$mode"
    fi
    vn_preflight_plugin
    if [[ "$missing" -eq 0 ]]; then
        vn_say "-- preflight: nothing missing"
    else
        vn_say "-- preflight: $missing missing"
    fi
    return "$missing"
}

# The NCCL wheel, nvcc, PyTorch and the GPU (part of vn_preflight; uses its helpers).
vn_preflight_cuda() {
    local mode="$1" out
    if [[ -z "$VN_NCCL_HOME" ]] && command -v "$VN_PYTHON" >/dev/null 2>&1; then
        # nvidia.nccl is a namespace package (its __file__ is None): use __path__.
        out="$("$VN_PYTHON" - <<'PYEOF' 2>&1
import importlib.metadata as md
import os
wheels = []
for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
    try:
        wheels.append("%s==%s" % (name, md.version(name)))
    except md.PackageNotFoundError:
        pass
home = ""
try:
    import nvidia.nccl as m
    paths = list(getattr(m, "__path__", []) or [])
    if not paths and getattr(m, "__file__", None):
        paths = [os.path.dirname(m.__file__)]
    for p in paths:
        if os.path.isfile(os.path.join(p, "include", "nccl.h")):
            home = p
            break
    if not home and paths:
        home = paths[0]
except Exception as e:  # noqa: BLE001 - report anything
    print("import-error %r" % (e,))
print("wheels " + ",".join(wheels))
print("home " + home)
PYEOF
)"
        VN_NCCL_WHEEL="$(sed -n 's/^wheels //p' <<<"$out")"
        VN_NCCL_HOME="$(sed -n 's/^home //p' <<<"$out")"
        if [[ -z "$VN_NCCL_HOME" ]]; then
            # Fall back to pip's file list.
            local w loc rel pipout
            for w in nvidia-nccl-cu13 nvidia-nccl-cu12; do
                pipout="$("$VN_PYTHON" -m pip show -f "$w" 2>/dev/null)" || continue
                loc="$(sed -n 's/^Location: //p' <<<"$pipout")"
                rel="$(grep -m1 -E '^ +nvidia/nccl/include/nccl\.h$' <<<"$pipout" | tr -d ' ')"
                if [[ -n "$loc" && -n "$rel" ]]; then
                    VN_NCCL_HOME="$loc/nvidia/nccl"
                    VN_NCCL_WHEEL="${VN_NCCL_WHEEL:-$w}"
                    break
                fi
            done
        fi
    fi
    if [[ -n "$VN_NCCL_HOME" && -f "$VN_NCCL_HOME/include/nccl.h" && -e "$VN_NCCL_HOME/lib/libnccl.so.2" ]]; then
        VN_NCCL_VERSION="$(awk '/^#define NCCL_MAJOR /{a=$3} /^#define NCCL_MINOR /{b=$3} /^#define NCCL_PATCH /{c=$3} END {if (a != "") print a "." b "." c}' "$VN_NCCL_HOME/include/nccl.h")"
        vn_pf_ok "NCCL ${VN_NCCL_VERSION:-?} (${VN_NCCL_WHEEL:-VERBSNET_NCCL_HOME}) at $VN_NCCL_HOME"
        if [[ "$VN_NCCL_WHEEL" == *,* ]]; then
            vn_pf_warn "several NCCL wheels installed ($VN_NCCL_WHEEL): they share nvidia/nccl; the files there win"
        fi
        if [[ -n "$VN_NCCL_VERSION" ]] && ! vn_version_ge "$VN_NCCL_VERSION" 2.19.0; then
            vn_pf_miss "NCCL >= 2.19 (verbsnet exports ncclNetPlugin_v7 ... v12; $VN_NCCL_VERSION probes v6 at most)"
        fi
    else
        vn_pf_miss "NCCL wheel: no include/nccl.h + lib/libnccl.so.2 (pip install nvidia-nccl-cu13 or -cu12, or set VERBSNET_NCCL_HOME)${out:+; python said: $(tr '\n' ' ' <<<"$out")}"
    fi

    # nvcc and its host compiler
    VN_NVCC="${NVCC:-}"
    if [[ -z "$VN_NVCC" ]]; then
        local c
        for c in "$(command -v nvcc 2>/dev/null)" "${CUDA_HOME:-}/bin/nvcc" "${CUDA_PATH:-}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
            if [[ -n "$c" && "$c" != /bin/nvcc && -x "$c" ]]; then
                VN_NVCC="$c"
                break
            fi
        done
    fi
    if [[ -n "$VN_NVCC" && -x "$VN_NVCC" ]]; then
        local rel
        rel="$("$VN_NVCC" --version 2>/dev/null | grep -oE 'release [0-9]+\.[0-9]+' | awk '{print $2}')"
        vn_pf_ok "nvcc $rel: $VN_NVCC"
        if [[ "$VN_NCCL_WHEEL" == *cu13* && "$rel" == 12.* ]] || [[ "$VN_NCCL_WHEEL" == *cu12* && "$rel" == 13.* ]]; then
            vn_pf_warn "nvcc $rel with $VN_NCCL_WHEEL: fine for a host-only program, but the driver must support the newer CUDA"
        fi
    else
        vn_pf_miss "nvcc (set NVCC or CUDA_HOME, or put it on PATH)"
    fi
    if command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1; then
        vn_pf_ok "host C++ compiler for nvcc"
    else
        vn_pf_miss "g++ (nvcc's host compiler)"
    fi

    # PyTorch
    if [[ "$VN_SKIP_TORCH" == 1 ]]; then
        vn_pf_ok "PyTorch not needed (--skip-torch)"
    elif out="$("$VN_PYTHON" -c 'import torch, torch.distributed as d; print(torch.__version__, "cuda", torch.version.cuda, "nccl-backend", d.is_nccl_available())' 2>&1)"; then
        vn_pf_ok "PyTorch: $(tail -n1 <<<"$out")"
        if [[ "$out" == *"nccl-backend False"* ]]; then
            vn_pf_miss "PyTorch built with the NCCL backend"
        fi
    else
        vn_pf_miss "PyTorch (import torch failed: $(tail -n1 <<<"$out"))"
    fi

    # GPU (checked for real only by the run)
    if command -v nvidia-smi >/dev/null 2>&1; then
        out="$(nvidia-smi -L 2>&1 | head -n4)"
        if grep -q '^GPU ' <<<"$out"; then
            vn_pf_ok "GPU: $(head -n1 <<<"$out")"
        elif [[ "$mode" == preflight ]]; then
            vn_pf_warn "nvidia-smi lists no GPU: $(head -n1 <<<"$out")"
        else
            vn_pf_miss "a GPU (nvidia-smi: $(head -n1 <<<"$out"))"
        fi
    elif [[ "$mode" == preflight ]]; then
        vn_pf_warn "no nvidia-smi (fine for preflight; the run needs a GPU)"
    else
        vn_pf_warn "no nvidia-smi: the CUDA runtime will have to find the GPU"
    fi
}

# The plugin .so (part of vn_preflight; uses its helpers).
vn_preflight_plugin() {
    local out
    VN_PLUGIN="${VERBSNET_PLUGIN_SO:-$VN_REPO/target/release/libnccl_net_verbsnet.so}"
    if [[ "$VN_PLUGIN" != /* ]]; then
        VN_PLUGIN="$PWD/$VN_PLUGIN"
    fi
    if [[ ! -f "$VN_PLUGIN" ]]; then
        vn_pf_miss "plugin $VN_PLUGIN (cargo build --release; on the device machine pass carry: [\"target/release/libnccl_net_verbsnet.so\"])"
    else
        local needed machine host_machine
        needed="$(readelf -d "$VN_PLUGIN" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
        machine="$(readelf -h "$VN_PLUGIN" 2>/dev/null | sed -n 's/^ *Machine: *//p')"
        vn_pf_ok "plugin $VN_PLUGIN ($(stat -c %s "$VN_PLUGIN") bytes, $machine; NEEDED: $needed)"
        host_machine="$(uname -m)"
        if [[ "$host_machine" == x86_64 && "$machine" != *X86-64* ]] || [[ "$host_machine" == aarch64 && "$machine" != *AArch64* ]]; then
            vn_pf_miss "a plugin built for $host_machine (this one is $machine)"
        fi
        if grep -qiE 'libibverbs|librdmacm|libmlx[45]' <<<"$needed"; then
            vn_pf_miss "a plugin without a NEEDED verbs library (it has: $needed); it must dlopen libibverbs"
        fi
        if readelf --dyn-syms -W "$VN_PLUGIN" 2>/dev/null | awk '$7 != "UND" && $8 == "ncclNetPlugin_v8" {f=1} END {exit !f}'; then
            vn_pf_ok "plugin defines ncclNetPlugin_v8"
        else
            vn_pf_miss "symbol ncclNetPlugin_v8 defined in the plugin"
        fi
        out="$(ldd "$VN_PLUGIN" 2>&1 | grep 'not found')"
        if [[ -n "$out" ]]; then
            vn_pf_miss "libraries the plugin needs: $(tr '\n' ' ' <<<"$out")"
        fi
        local need_glibc have_glibc
        need_glibc="$(readelf -V "$VN_PLUGIN" 2>/dev/null | grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' | sed 's/GLIBC_//' | sort -uV | tail -n1)"
        have_glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
        if [[ -n "$need_glibc" && -n "$have_glibc" ]]; then
            if vn_version_ge "$have_glibc" "$need_glibc"; then
                vn_pf_ok "glibc $have_glibc >= $need_glibc the plugin needs"
            else
                vn_pf_miss "glibc >= $need_glibc for the plugin (this machine has $have_glibc): build it on an older system"
            fi
        fi
    fi
}

vn_build() {
    local t
    t="$(vn_timeout 150)"
    if [[ "$t" -eq 0 ]]; then
        vn_step FAIL build "no time left in the budget"
        return 1
    fi
    VN_BIN="$VN_WORK/allreduce_check"
    local -a cmd=("$VN_NVCC" -O2 -o "$VN_BIN" "$VN_GPU_DIR/allreduce_check.cu" "$VN_GPU_DIR/report.c"
        -I"$VN_NCCL_HOME/include" -L"$VN_NCCL_HOME/lib" -l:libnccl.so.2
        -Xlinker -rpath -Xlinker "$VN_NCCL_HOME/lib")
    local -a extra=()
    read -r -a extra <<<"${VERBSNET_NVCC_FLAGS:-}"
    cmd+=("${extra[@]}")
    if [[ "$VN_FAKE" == 1 ]]; then
        cmd=("${CC:-gcc}" -std=c11 -D_GNU_SOURCE -DVERBSNET_FAKE_NCCL -O1 -o "$VN_BIN"
            -x c "$VN_GPU_DIR/allreduce_check.cu" -x none "$VN_GPU_DIR/report.c" -ldl)
    fi
    vn_say "-- build: ${cmd[*]}"
    if ! timeout -k 5 "$t" "${cmd[@]}" >>"$VN_CHECK_LOG" 2>&1; then
        tail -n 20 "$VN_CHECK_LOG"
        vn_step FAIL build "nvcc failed (see check.log)"
        return 1
    fi
    local linked
    linked="$(ldd "$VN_BIN" 2>/dev/null | grep -m1 'libnccl.so' | sed -e 's/^[[:space:]]*//' -e 's/ (0x[0-9a-f]*)$//')"
    vn_step PASS build "allreduce_check built, ${linked:-no libnccl linked (fake NCCL)}"
}

# vn_run_pair NAME NET: runs 2 ranks of allreduce_check on GPU 0; logs in $VN_WORK/NAME.
vn_run_pair() {
    local name="$1" net="$2" dir="$VN_WORK/$1" t size_t r
    mkdir -p "$dir"
    t="$(vn_timeout "$VN_RUN_TIMEOUT")"
    if [[ "$t" -eq 0 ]]; then
        vn_step FAIL "$name" "no time left in the budget"
        return 1
    fi
    size_t="${VERBSNET_GPU_SIZE_TIMEOUT:-60}"
    size_t=$((t < size_t ? t : size_t))
    # env options (-u NAME) first, then assignments.
    local -a netenv
    if [[ "$net" == verbsnet ]]; then
        netenv=(NCCL_NET=verbsnet "NCCL_NET_PLUGIN=$VN_PLUGIN_ARG" VERBSNET_TRANSPORT=tcp
            VERBSNET_SOCKET_ADDR="${VERBSNET_SOCKET_ADDR:-127.0.0.1}")
        if [[ -n "$VN_PLUGIN_LIBDIR" ]]; then
            netenv+=("LD_LIBRARY_PATH=$VN_PLUGIN_LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
        fi
    elif [[ -n "$VN_NO_PLUGIN_ARG" ]]; then
        netenv=(NCCL_NET=Socket "NCCL_NET_PLUGIN=$VN_NO_PLUGIN_ARG")
    else
        netenv=(-u NCCL_NET_PLUGIN NCCL_NET=Socket)
    fi
    vn_say "-- run $name: 2 ranks, ${t}s limit, env: ${VN_COMMON_ENV[*]} ${netenv[*]} NCCL_HOSTID=verbsnet-gpu-check-host<rank>"
    local -a pids=()
    for r in 0 1; do
        local -a args=(--rank "$r" --nranks 2 --device 0 --id-file "$dir/id"
            --max-bytes "$VN_MAX_BYTES" --iter-budget "${VERBSNET_GPU_ITER_BUDGET:-512M}"
            --size-timeout "$size_t" --init-timeout "$size_t")
        if [[ "$r" -eq 0 ]]; then
            args+=(--table "$dir/table.txt")
        fi
        env "${netenv[@]}" "${VN_COMMON_ENV[@]}" "NCCL_HOSTID=verbsnet-gpu-check-host$r" \
            timeout -k 5 "$t" "$VN_BIN" "${args[@]}" >"$dir/rank$r.log" 2>&1 &
        pids+=($!)
        VN_PIDS+=($!)
    done
    local -a rcs=()
    for r in 0 1; do
        wait "${pids[$r]}"
        rcs+=($?)
    done
    VN_PIDS=()
    local fails=0 combined="$VN_OUT/nccl-$name.log" reasons=""
    : >"$combined"
    for r in 0 1; do
        local rc="${rcs[$r]}" why
        case "$rc" in
            0) why="exit 0" ;;
            1) why="exit 1: wrong results" ;;
            2) why="exit 2: bad arguments" ;;
            3) why="exit 3: a CUDA or NCCL call failed" ;;
            4) why="exit 4: NCCL asynchronous error" ;;
            5) why="exit 5: a wait timed out inside the program" ;;
            124 | 137) why="killed after ${t}s by timeout (hang?)" ;;
            *) why="exit $rc" ;;
        esac
        {
            echo "===== $name rank $r: $why ====="
            cat "$dir/rank$r.log"
        } >>"$combined"
        vn_say "   rank $r: $why"
        if [[ "$rc" -ne 0 ]]; then
            fails=$((fails + 1))
            local first
            first="$(grep -m1 -E 'FAILED|NCCL WARN' "$dir/rank$r.log" | cut -c1-200)"
            reasons+="rank $r $why${first:+ (${first})}; "
            grep -m3 -E 'FAILED|NCCL WARN' "$dir/rank$r.log" | sed 's/^/     /' | tee -a "$VN_CHECK_LOG"
        fi
        local out
        out="$(vn_check_nccl_log "$dir/rank$r.log" "$net" "$VN_NCCL_VERSION" "$([[ $net == verbsnet ]] && echo 1 || echo 0)")" || {
            fails=$((fails + 1))
            reasons+="rank $r log: $(grep -m1 '^FAIL' <<<"$out" | cut -c7-); "
        }
        vn_indent "   rank $r log " <<<"$out"
    done
    local out
    out="$(vn_check_table "$dir/table.txt" "$VN_NSIZES")" || {
        fails=$((fails + 1))
        reasons+="table: $(grep -m1 '^FAIL' <<<"$out" | cut -c7-); "
    }
    vn_indent "   table " <<<"$out"
    if [[ -s "$dir/table.txt" ]]; then
        cp "$dir/table.txt" "$VN_WORK/table-$name.txt"
    fi
    vn_cap_file "$combined"
    if [[ "$fails" -eq 0 ]]; then
        vn_step PASS "$name" "2 ranks, $VN_NSIZES sizes, #wrong 0, every channel via NET/$net"
    else
        vn_step FAIL "$name" "${reasons%; }"
    fi
    [[ "$fails" -eq 0 ]]
}

vn_run_torch() {
    local dir="$VN_WORK/torch" t r
    mkdir -p "$dir"
    t="$(vn_timeout "$VN_RUN_TIMEOUT")"
    if [[ "$t" -eq 0 ]]; then
        vn_step FAIL torch-verbsnet "no time left in the budget"
        return 1
    fi
    local -a netenv=(NCCL_NET=verbsnet "NCCL_NET_PLUGIN=$VN_PLUGIN_ARG" VERBSNET_TRANSPORT=tcp
        VERBSNET_SOCKET_ADDR="${VERBSNET_SOCKET_ADDR:-127.0.0.1}" PYTHONUNBUFFERED=1)
    if [[ -n "$VN_PLUGIN_LIBDIR" ]]; then
        netenv+=("LD_LIBRARY_PATH=$VN_PLUGIN_LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
    fi
    vn_say "-- run torch-verbsnet: torch.distributed nccl, 2 spawned ranks, ${t}s limit"
    env "${netenv[@]}" "${VN_COMMON_ENV[@]}" timeout -k 5 "$t" "$VN_PYTHON" \
        "$VN_GPU_DIR/torch_allreduce.py" --log-dir "$dir" --world-size 2 \
        --hostid-prefix verbsnet-gpu-check-host --timeout "$((t > 15 ? t - 10 : t))" \
        >"$dir/parent.log" 2>&1 &
    local pid=$!
    VN_PIDS+=("$pid")
    wait "$pid"
    local rc=$? fails=0 reasons="" combined="$VN_OUT/torch-verbsnet.log"
    VN_PIDS=()
    {
        echo "===== torch parent: exit $rc ====="
        cat "$dir/parent.log"
        for r in 0 1; do
            echo "===== torch rank $r ====="
            cat "$dir/rank$r.log" 2>/dev/null || echo "(no log)"
        done
    } >"$combined"
    sed 's/^/   /' "$dir/parent.log" | tail -n 25 | tee -a "$VN_CHECK_LOG"
    if [[ "$rc" -ne 0 ]]; then
        fails=$((fails + 1))
        case "$rc" in
            124 | 137) reasons+="killed after ${t}s by timeout (hang?); " ;;
            *) reasons+="torch_allreduce.py exit $rc ($(grep -m1 -E '^torch-check: FAIL' "$dir/parent.log" | cut -c1-300)); " ;;
        esac
    fi
    for r in 0 1; do
        local out
        out="$(vn_check_nccl_log "$dir/rank$r.log" verbsnet "" 1)" || {
            fails=$((fails + 1))
            reasons+="rank $r log: $(grep -m1 '^FAIL' <<<"$out" | cut -c7-); "
        }
        vn_indent "   rank $r log " <<<"$out"
    done
    vn_cap_file "$combined"
    if [[ "$fails" -eq 0 ]]; then
        vn_step PASS torch-verbsnet "torch.distributed all_reduce checked, channels via NET/verbsnet"
    else
        vn_step FAIL torch-verbsnet "${reasons%; }"
    fi
    [[ "$fails" -eq 0 ]]
}

vn_usage() {
    sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

vn_main() {
    local mode=run
    VN_SKIP_TORCH=0
    VN_FAKE="${VERBSNET_GPU_FAKE:-0}"
    VN_MODE=run
    local skip_socket=0 arg
    for arg in "$@"; do
        case "$arg" in
            --preflight) mode=preflight ;;
            --build-only) mode=build ;;
            --skip-socket) skip_socket=1 ;;
            --skip-torch) VN_SKIP_TORCH=1 ;;
            -h | --help) vn_usage; return 0 ;;
            *) echo "unknown argument: $arg (try --help)" >&2; return 2 ;;
        esac
    done
    VN_MODE="$mode"

    VN_GPU_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    VN_REPO="$(cd "$VN_GPU_DIR/../.." && pwd)"
    VN_OUT="${OUT:-./gpu-out}"
    mkdir -p "$VN_OUT" || { echo "cannot create OUT=$VN_OUT" >&2; return 2; }
    VN_OUT="$(cd "$VN_OUT" && pwd)"
    VN_CHECK_LOG="$VN_OUT/check.log"
    VN_SUMMARY="$VN_OUT/summary.txt"
    : >"$VN_CHECK_LOG"
    VN_START=$SECONDS
    VN_BUDGET="${VERBSNET_GPU_BUDGET_S:-285}"
    VN_RUN_TIMEOUT="${VERBSNET_GPU_RUN_TIMEOUT:-100}"
    VN_MAX_BYTES="${VERBSNET_GPU_MAX_BYTES:-256M}"
    vn_say "verbsnet GPU check ($mode) in $VN_REPO at $(date -u '+%Y-%m-%dT%H:%M:%SZ'), output in $VN_OUT"
    vn_say "git: $(git -C "$VN_REPO" log -1 --format='%h %s' 2>/dev/null || echo 'not a git checkout')"

    VN_WORK="$(mktemp -d "${TMPDIR:-/tmp}/verbsnet-gpu-check.XXXXXX")" || { echo "mktemp failed" >&2; return 2; }
    trap vn_cleanup EXIT
    trap 'vn_say "interrupted"; exit 130' INT TERM

    local missing=0
    vn_preflight "$mode" || missing=$?
    if [[ "$mode" == preflight ]]; then
        [[ "$missing" -eq 0 ]]
        return $?
    fi
    if [[ "$missing" -ne 0 ]]; then
        vn_step FAIL preflight "$missing requirement(s) missing (see the MISSING lines above)"
        vn_write_summary
        return 1
    fi
    vn_step PASS preflight "NCCL ${VN_NCCL_VERSION:-$([[ $VN_FAKE == 1 ]] && echo "(fake)" || echo "(version unknown)")}, plugin present"

    if ! vn_build; then
        vn_write_summary
        return 1
    fi
    if [[ "$mode" == build ]]; then
        vn_write_summary
        return "$VN_FAILED"
    fi

    # How NCCL is told where the plugin is: an absolute path works from 2.24 on; older
    # releases only dlopen libnccl-net-<NCCL_NET_PLUGIN>.so from the library path.
    VN_PLUGIN_LIBDIR=""
    if [[ -z "$VN_NCCL_VERSION" ]] || vn_version_ge "$VN_NCCL_VERSION" 2.24.0; then
        VN_PLUGIN_ARG="$VN_PLUGIN"
    else
        VN_PLUGIN_LIBDIR="$VN_WORK/pluginlib"
        mkdir -p "$VN_PLUGIN_LIBDIR"
        ln -sf "$VN_PLUGIN" "$VN_PLUGIN_LIBDIR/libnccl-net-verbsnet.so"
        VN_PLUGIN_ARG=verbsnet
    fi
    # "none" disables external plugins from 2.28 on; before, an unset name only looks for
    # libnccl-net.so, and NCCL_NET=Socket keeps any such plugin out anyway.
    if [[ -n "$VN_NCCL_VERSION" ]] && vn_version_ge "$VN_NCCL_VERSION" 2.28.0; then
        VN_NO_PLUGIN_ARG=none
    else
        VN_NO_PLUGIN_ARG=""
    fi
    VN_COMMON_ENV=(
        NCCL_DEBUG=INFO
        "NCCL_DEBUG_SUBSYS=INIT,NET,ENV"
        "NCCL_MAX_NCHANNELS=${VERBSNET_GPU_NCHANNELS:-2}"
        "NCCL_SOCKET_IFNAME=${VERBSNET_GPU_IFNAME:-lo}"
        NCCL_NVLS_ENABLE=0
        NCCL_COLLNET_ENABLE=0
        CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
    )
    local top
    if ! top="$(vn_parse_bytes "$VN_MAX_BYTES")" || [[ "$top" -lt 8 ]]; then
        vn_step FAIL setup "bad VERBSNET_GPU_MAX_BYTES=$VN_MAX_BYTES (want e.g. 256M)"
        vn_write_summary
        return 1
    fi
    VN_NSIZES="$(vn_sweep_count 8 "$top")"
    vn_say "-- environment passed in: $(env | grep -E '^(NCCL|VERBSNET|CUDA|TORCH_NCCL)_' | tr '\n' ' ')"

    # Most important first, so a tight budget cuts the baseline rather than a proof.
    vn_run_pair verbsnet verbsnet
    if [[ "$VN_SKIP_TORCH" == 1 ]]; then
        vn_step SKIP torch-verbsnet "--skip-torch"
    elif [[ "$VN_FAKE" == 1 ]]; then
        vn_step SKIP torch-verbsnet "fake NCCL self-test (selftest.sh runs torch_allreduce.py with gloo)"
    else
        vn_run_torch
    fi
    if [[ "$skip_socket" == 1 ]]; then
        vn_step SKIP socket "--skip-socket"
    else
        vn_run_pair socket Socket
    fi
    vn_write_summary
    return "$VN_FAILED"
}

vn_write_summary() {
    {
        echo "verbsnet stock-NCCL GPU check: $([[ $VN_FAILED -eq 0 ]] && echo PASS || echo FAIL)$([[ $VN_FAKE == 1 ]] && echo ' (FAKE NCCL SELF-TEST without a GPU: proves nothing about NCCL)')$([[ $VN_MODE != run ]] && echo " (mode $VN_MODE: not the full check)")"
        echo "date: $(date -u '+%Y-%m-%dT%H:%M:%SZ'), $((SECONDS - VN_START)) s"
        echo "git: $(git -C "$VN_REPO" log -1 --format='%H %s' 2>/dev/null || echo n/a)"
        echo "host: $(uname -srm); GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1 || echo n/a)"
        echo "NCCL: ${VN_NCCL_VERSION:-?} (${VN_NCCL_WHEEL:-?}) at ${VN_NCCL_HOME:-?}"
        echo "nvcc: $("${VN_NVCC:-nvcc}" --version 2>/dev/null | grep -oE 'release [0-9.]+' || echo n/a)"
        echo "plugin: ${VN_PLUGIN:-?} ($(sha256sum "${VN_PLUGIN:-/dev/null}" 2>/dev/null | cut -c1-16))"
        echo
        echo "steps:"
        printf '  %s\n' "${VN_STEPS[@]}"
        local f
        for f in verbsnet socket; do
            if [[ -s "$VN_WORK/table-$f.txt" ]]; then
                echo
                echo "all_reduce through $f (rank 0's table):"
                cat "$VN_WORK/table-$f.txt"
            fi
        done
        if [[ -s "$VN_WORK/table-verbsnet.txt" && -s "$VN_WORK/table-socket.txt" ]]; then
            echo
            echo "busbw ratio verbsnet (tcp stand-in) / NCCL Socket, same machine, 2 ranks on one GPU:"
            vn_ratio_table "$VN_WORK/table-verbsnet.txt" "$VN_WORK/table-socket.txt"
        fi
        if [[ -s "$VN_WORK/torch/table.txt" ]]; then
            echo
            echo "torch.distributed all_reduce through verbsnet (rank 0):"
            cat "$VN_WORK/torch/table.txt"
        fi
    } >"$VN_SUMMARY"
    vn_say ""
    cat "$VN_SUMMARY"
    echo "(summary in $VN_SUMMARY; logs in $VN_OUT)"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    set -uo pipefail
    vn_main "$@"
    exit $?
fi
