#!/usr/bin/env bash
# Generation speed of the issue's char-level GPT (4 blocks, d_model 128, 4 heads, context 128):
# `dtrain generate` with its key/value cache and with --no-cache, against PyTorch 1.13's naive
# loop without a cache (bench/torch_lm_generate.py: the whole window per token), one thread,
# greedy (temperature 0). dtrain's model is trained for one step and saved (the speed does not
# depend on the weights); its rate is per-token CPU time from two runs of different lengths
# (so loading the model and the tokenizer cancels out), PyTorch's from its process CPU time per
# token (time.process_time).
# Usage: bench/lm_generate.sh [tokens]   (default 120: prompt + tokens fit the context of 128; past
# it the window slides, and with learned positions the cache restarts from the window each token)
# Needs a build (scripts/build.sh), python3-torch and the fortunes (scripts/install_deps.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_setup
tokens="${1:-120}"
dtrain="${BUILD_DIR:-build}/dtrain"
need_binary "$dtrain"
corpus="$tmp/fortunes.txt"
fortunes_corpus "$corpus"
ctx=128 layers=4 d=128 heads=4
"$dtrain" fit --arch gpt --corpus "$corpus" --context $ctx --layers $layers --d-model $d \
  --heads $heads --batch-size 8 --optimizer adamw --validation-split 0 --epochs 1 \
  --steps-per-epoch 1 --threads 1 --seed 0 --save "$tmp/lm.keras" > "$tmp/fit.log" 2>&1
prompt="The "
# cpu_seconds ARGS...: user + system seconds of one `dtrain generate`.
cpu_seconds() {
  /usr/bin/time -f "%U %S" -o "$tmp/time" "$dtrain" generate --model "$tmp/lm.keras" \
    --prompt "$prompt" --temperature 0 "$@" > /dev/null
  awk '{ print $1 + $2 }' "$tmp/time"
}
rate() {  # tokens/s from the CPU time of $tokens and of 10 tokens
  local long short
  long=$(cpu_seconds --tokens "$tokens" "$@")
  short=$(cpu_seconds --tokens 10 "$@")
  awk -v l="$long" -v s="$short" -v n="$tokens" 'BEGIN { printf "%.1f", (n - 10) / (l - s) }'
}
cached=$(rate)
uncached=$(rate --no-cache)
vocab=$(grep -oE 'vocabulary [0-9]+' "$tmp/fit.log" | grep -oE '[0-9]+' | head -1 || true)
/usr/bin/python3 bench/torch_lm_generate.py "${vocab:-113}" "$tokens" $ctx $layers $d $heads \
  ${#prompt} 1 > "$tmp/torch"
torch_rate=$(get tokens_per_second "$tmp/torch")
print_machine
echo "workload: greedy generation of $tokens tokens after a ${#prompt}-character prompt; context $ctx, $layers blocks, d_model $d, $heads heads"
printf '%-40s %10s\n' "dtrain generate (key/value cache)" "$cached" \
  "dtrain generate --no-cache" "$uncached" "pytorch naive loop (no cache)" "$torch_rate"
awk -v c="$cached" -v t="$torch_rate" 'BEGIN { printf "speedup (cached dtrain / naive pytorch): %.1fx\n", c / t }'
