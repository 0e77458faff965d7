#!/usr/bin/env bash
# init_model.sh RLHOST: `rlhost init-model` writes a model folder that the
# runtime loads (rlhost serve answers on it); bad usage is a clear error.
set -euo pipefail
rlhost=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "init_model.sh: $*" >&2; exit 1; }

"$rlhost" init-model --preset tiny --out "$tmp/tiny" --seed 7 | grep -q "wrote the 'tiny' model to $tmp/tiny" ||
    fail "no confirmation line"
for f in config.json model.safetensors tokenizer.json; do
    [ -s "$tmp/tiny/$f" ] || fail "$f missing"
done
grep -q '"Qwen3ForCausalLM"' "$tmp/tiny/config.json" || fail "config.json is not a Qwen3 config"
# The same seed writes the same weights.
"$rlhost" init-model --preset tiny --out "$tmp/again" --seed 7 >/dev/null
cmp -s "$tmp/tiny/model.safetensors" "$tmp/again/model.safetensors" || fail "seed 7 twice differs"
# The folder loads: `rlhost serve` reports its address.
serves() { # serves DIR
    "$rlhost" serve --model "$1" --port 0 >"$tmp/serve.out" 2>"$tmp/serve.err" &
    pid=$!
    for _ in $(seq 1 600); do
        grep -q "listening on" "$tmp/serve.out" && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    grep -q "listening on" "$tmp/serve.out" || { cat "$tmp/serve.err" >&2; fail "rlhost serve did not load $1"; }
    kill -TERM "$pid"
    wait "$pid" || true
}
serves "$tmp/tiny"
# The mixture-of-experts preset: a Qwen3-MoE folder that loads too.
"$rlhost" init-model --preset tiny-moe --out "$tmp/moe" --seed 7 | grep -q "wrote the 'tiny-moe' model to $tmp/moe" ||
    fail "no confirmation line for tiny-moe"
grep -q '"Qwen3MoeForCausalLM"' "$tmp/moe/config.json" || fail "tiny-moe's config.json is not a Qwen3-MoE config"
serves "$tmp/moe"

expect_error() { # expect_error WORDS ARGS...: exit 1 and WORDS on stderr
    local words=$1
    shift
    if out=$("$rlhost" init-model "$@" 2>&1); then fail "init-model $* succeeded"; fi
    printf '%s\n' "$out" | grep -qF -- "$words" || fail "init-model $*: no '$words' in: $out"
}
expect_error "--preset and --out are required" --preset tiny
expect_error "unknown option '--bogus'" --bogus 1
expect_error "--seed must be an integer >= 0, got 'x'" --preset tiny --out "$tmp/x" --seed x
expect_error "unknown preset 'huge'; valid: tiny, tiny-moe" --preset huge --out "$tmp/y"
echo "init_model.sh: ok"
