#!/usr/bin/env bash
# Builds the fuzz targets of fuzz/ with clang and libFuzzer and runs each one.
#
#   scripts/run-fuzz.sh BUILD SECONDS [TARGET...]
#
# BUILD: the clang build folder (`make fuzz`: build-fuzz); SECONDS: the run
# time of each target (-max_total_time); TARGETs: some of them (default all).
# Each target starts from its seed corpus (fuzz/corpus/<target>) and its
# regression inputs (fuzz/regressions/<target>, not the *.pending ones), and
# grows its working corpus in BUILD/corpus/<target>/ (kept between runs).
# Crash, leak, timeout and out-of-memory inputs land in BUILD/crashes/<target>/.
# Prints executions per target; exits 1 when any target found something,
# 77 when clang or libFuzzer is missing (the ctest test fuzz_short_runs skips).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD SECONDS [TARGET...]" >&2
  exit 2
fi
build=$1
seconds=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=${FUZZ_JOBS:-2}

cc=${FUZZ_CC:-clang}
cxx=${FUZZ_CXX:-clang++}
if ! command -v "$cxx" >/dev/null || ! command -v "$cc" >/dev/null; then
  echo "run-fuzz: $cxx not found (install clang and libclang-rt-14-dev; scripts/install-deps.sh)" >&2
  exit 77
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
  'extern "C" int LLVMFuzzerTestOneInput(const uint8_t *, size_t) { return 0; }' >"$probe/p.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" 2>"$probe/err"; then
  echo "run-fuzz: $cxx cannot link libFuzzer (libclang-rt-14-dev missing?):" >&2
  cat "$probe/err" >&2
  exit 77
fi

mkdir -p "$build"
build=$(cd "$build" && pwd)
# FUZZ_OPT (default -O1): the targets' optimization flag (the ctest short runs: -O0).
opt=${FUZZ_OPT:--O1}
if [ ! -f "$build/build.ninja" ] || ! grep -qx "RL_FUZZ_OPT:STRING=$opt" "$build/CMakeCache.txt"; then
  CC=$cc CXX=$cxx cmake -S "$root/fuzz" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=None \
    -DRL_FUZZ_OPT="$opt" >/dev/null
fi
# ccache (when installed) on absolute paths: the ctest short runs' build
# (build/fuzz-clang) reuses the objects of build-fuzz/ and the other way round.
unset CCACHE_BASEDIR
export CCACHE_NOHASHDIR=1
cmake --build "$build" -j "$jobs"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$root"/fuzz/fuzz_*.cpp; do
    t=$(basename "$f" .cpp)
    targets+=("${t#fuzz_}")
  done
fi

# Leak reports name the input too; symbolized stacks in the reports.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
summary=()
for t in "${targets[@]}"; do
  corpus=$build/corpus/$t
  crashes=$build/crashes/$t
  mkdir -p "$corpus" "$crashes"
  for seeds in "$root/fuzz/corpus/$t" "$root/fuzz/regressions/$t"; do
    [ -d "$seeds" ] || continue
    find "$seeds" -type f ! -name '*.pending' -exec cp -n -t "$corpus" {} +
  done
  log=$build/$t.log
  echo "== fuzz_$t: ${seconds}s (log: $log)"
  before=$(find "$crashes" -type f | wc -l)
  status=0
  "$build/fuzz_$t" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$crashes/" >"$log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(grep -o 'exec/s: [0-9]*' "$log" | tail -1 | sed 's/exec\/s: //')
  size=$(find "$corpus" -type f | wc -l)
  line=$(printf '%-16s %12s execs %8s exec/s %6s corpus files' "$t" "${execs:-?}" "${rate:-?}" "$size")
  after=$(find "$crashes" -type f | wc -l)
  if [ $status -ne 0 ] || [ "$after" -gt "$before" ]; then
    failed+=("$t")
    line="$line  FOUND (exit $status)"
    echo "run-fuzz: fuzz_$t found a problem (exit $status); the input:" >&2
    grep -o "Test unit written to .*" "$log" | sed 's/^/  /' >&2 || true
    grep -m1 -A25 -E '^==[0-9]+==ERROR|runtime error:|deadly signal|ERROR: libFuzzer' "$log" \
      | sed 's/^/    /' >&2 || true
  fi
  echo "$line"
  summary+=("$line")
done

echo
echo "executions per target (${seconds}s each):"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "run-fuzz: findings in: ${failed[*]} (inputs under $build/crashes/)" >&2
  exit 1
fi
