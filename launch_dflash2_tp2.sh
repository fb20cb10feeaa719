#!/usr/bin/env bash
# launch_dflash2_tp2.sh: start the DFlash2 speculative-decoding vLLM stack on every node with one command.
# Rendered by `sparkserve render --launcher` from templates/launch_dflash2_tp2.sh.j2. Do not edit: change
# the config and render again (a test fails when this file and its render differ).
#
# Run on the head node (spark-a): followers start first over ssh, then the head (API server).
#   ./launch_dflash2_tp2.sh                                 GRAPHS=1 (default): CUDA graphs FULL_AND_PIECEWISE [1, 2, 4, 8, 16, 24, 32]
#   EAGER=1 ./launch_dflash2_tp2.sh                         --enforce-eager (GRAPHS=0 means the same)
#   DRAFTER_HOST_PATH=/models/other ./launch_dflash2_tp2.sh another drafter (same path on every node)
# VLLM_API_KEY, when set here, reaches the head's API server through the environment, never an argv.
# DRAFTER_JSON_READER=python3|jq picks how the drafter's config.json is read (default: python3, else jq).
# Exit codes: 0 started, 2 bad input (knob, drafter), 3 a node step failed.
#
# Config fingerprints: graphs 4f9f286fbf5c6d9a2ceec16e496db036145b1d4de8e5106fbe79b70c51b6316f
#                      eager  176696cbc577b9ad2da0cb467bc7787c7d94274990b9f9a91ff0ee6f81e31cbc
set -euo pipefail

DEFAULT_DRAFTER_HOST_PATH=/models/GLM-5.3-Flash-DFlash2-E
GRAPHS="${GRAPHS:-1}"
EAGER="${EAGER:-0}"
DRAFTER_HOST_PATH="${DRAFTER_HOST_PATH:-$DEFAULT_DRAFTER_HOST_PATH}"
DRAFTER_JSON_READER="${DRAFTER_JSON_READER:-auto}"
K=7  # speculative.num_speculative_tokens

die() { printf 'error: %s\n' "$*" >&2; exit 2; }
fail() { printf 'error: %s\n' "$*" >&2; exit 3; }
say() { printf '==> %s\n' "$*" >&2; }

[[ "$GRAPHS" == 0 || "$GRAPHS" == 1 ]] || die "GRAPHS: must be 0 or 1, got '$GRAPHS'"
[[ "$EAGER" == 0 || "$EAGER" == 1 ]] || die "EAGER: must be 0 or 1, got '$EAGER'"
case "$DRAFTER_JSON_READER" in
  auto | python3 | jq) ;;
  *) die "DRAFTER_JSON_READER: must be python3, jq or auto, got '$DRAFTER_JSON_READER'" ;;
esac
if [[ "$EAGER" == 1 || "$GRAPHS" == 0 ]]; then MODE=eager; else MODE=graphs; fi

# --- the drafter: present, with its mask file, and K = block_size - 1 ------------------------------------
case "$DRAFTER_HOST_PATH" in
  /*) ;;
  *) die "DRAFTER_HOST_PATH: '$DRAFTER_HOST_PATH' must be an absolute path (it is bind-mounted on every node)" ;;
esac
case "$DRAFTER_HOST_PATH" in
  *,* | *'"'*) die "DRAFTER_HOST_PATH: '$DRAFTER_HOST_PATH' holds a comma or a double quote (docker --mount cannot take it)" ;;
esac
[[ -d "$DRAFTER_HOST_PATH" ]] || die "DRAFTER_HOST_PATH: $DRAFTER_HOST_PATH is not a directory"
[[ -f "$DRAFTER_HOST_PATH/config.json" ]] || die "$DRAFTER_HOST_PATH/config.json: missing"
[[ -f "$DRAFTER_HOST_PATH/mask_embedding.pt" ]] ||
  die "$DRAFTER_HOST_PATH/mask_embedding.pt: missing; vLLM would silently ignore the trained mask (DO NOT SERVE)"

JSON_READER="$DRAFTER_JSON_READER"
if [[ "$JSON_READER" == auto ]]; then
  if command -v python3 >/dev/null 2>&1; then JSON_READER=python3; else JSON_READER=jq; fi
fi
command -v "$JSON_READER" >/dev/null 2>&1 || die "$JSON_READER: not installed (the launcher reads config.json with python3 or jq)"
drafter_facts() {  # drafter_facts CONFIG_JSON -> "<block_size|none> <first architecture>"
  case "$JSON_READER" in
    python3)
      python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
d = c.get("dflash_config") or {}
b = d.get("block_size", c.get("block_size"))
a = (c.get("architectures") or ["unknown"])[0]
print(b if isinstance(b, int) and not isinstance(b, bool) else "none", a)' "$1" 2>/dev/null ;;
    jq)
      jq -r '((.dflash_config.block_size // .block_size // "none") | tostring) + " " + ((.architectures // ["unknown"])[0])' "$1" 2>/dev/null ;;
  esac
}
facts="$(drafter_facts "$DRAFTER_HOST_PATH/config.json")" || die "$DRAFTER_HOST_PATH/config.json: not readable JSON"
read -r BLOCK ARCH <<<"$facts"
[[ "$BLOCK" =~ ^[0-9]+$ ]] || die "$DRAFTER_HOST_PATH/config.json: dflash_config.block_size is missing or not an integer"
if ((K != BLOCK - 1)); then
  if [[ "$ARCH" == DFlashDraftModel ]]; then
    say "warning: K=$K but the DFlash drafter's block_size is $BLOCK (the convention is K = block_size - 1)"
  else
    die "speculative K=$K but $ARCH's block_size is $BLOCK: K must be block_size - 1 = $((BLOCK - 1)) (other counts boot-wedge the stack)"
  fi
fi

# --- nodes ------------------------------------------------------------------------------------------------
on_node() {  # on_node RANK ARGV...: run an argv on that rank's node (the head is this machine)
  local rank="$1" cmd
  shift
  case "$rank" in
    0) "$@" ;;
    1) printf -v cmd '%q ' "$@" && ssh -o BatchMode=yes -p 22 ubuntu@spark-b.lan "$cmd" ;;
    *) die "no rank $rank" ;;
  esac
}

node_name() {
  case "$1" in
    0) echo spark-a ;;
    1) echo spark-b ;;
  esac
}

container_name() {
  case "$1" in
    0) echo sparkserve-r0-spark-a ;;
    1) echo sparkserve-r1-spark-b ;;
  esac
}

node_argv() {  # node_argv RANK: ARGV = that rank's `docker run` for $MODE (from the sparkserve plan)
  case "$1:$MODE" in
    0:graphs)
      ARGV=(
        docker run
        -d
        --name sparkserve-r0-spark-a
        --restart no
        --stop-timeout 30
        --label io.sparkserve.managed=1
        --label io.sparkserve.fingerprint=4f9f286fbf5c6d9a2ceec16e496db036145b1d4de8e5106fbe79b70c51b6316f
        --label io.sparkserve.node=spark-a
        --label io.sparkserve.rank=0
        --label io.sparkserve.role=head
        --network=host
        --ipc=host
        --shm-size 64g
        --ulimit memlock=-1:-1
        --cap-add IPC_LOCK
        --device /dev/infiniband
        --gpus all
        -e HF_HUB_OFFLINE=1
        -e TRANSFORMERS_OFFLINE=1
        -e VLLM_ENGINE_READY_TIMEOUT_S=3600
        -e VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=1800
        -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        -e NCCL_IB_DISABLE=0
        -e NCCL_CUMEM_ENABLE=0
        -e NCCL_NVLS_ENABLE=0
        -e NCCL_IGNORE_CPU_AFFINITY=1
        -e NCCL_DEBUG=WARN
        -e VLLM_USE_BREAKABLE_CUDAGRAPH=0
        -e VLLM_HOST_IP=192.168.200.1
        --mount 'type=bind,source=/models/GLM-5.3-Flash-W4A16-MTP,target=/models/target,readonly'
        --mount "type=bind,source=${DRAFTER_HOST_PATH},target=/models/drafter,readonly"
        --mount 'type=bind,source=/var/cache/sparkserve/vllm,target=/root/.cache/vllm'
        --mount 'type=bind,source=/var/cache/sparkserve/flashinfer,target=/root/.cache/flashinfer'
        --mount 'type=bind,source=/var/cache/sparkserve/triton,target=/root/.triton'
        --entrypoint vllm
        ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e
        serve /models/target
        --served-model-name glm-5.3-flash
        --tensor-parallel-size 2
        --enable-expert-parallel
        --max-model-len 262144
        --max-num-seqs 4
        --kv-cache-dtype fp8_e4m3
        --gpu-memory-utilization 0.795
        --kv-cache-memory-bytes 8G
        --compilation-config '{"cudagraph_mode":"FULL_AND_PIECEWISE","cudagraph_capture_sizes":[1,2,4,8,16,24,32]}'
        --speculative-config '{"method":"dflash","model":"/models/drafter","num_speculative_tokens":7}'
        --distributed-executor-backend mp
        --nnodes 2
        --node-rank 0
        --master-addr 192.168.200.1
        --master-port 29501
        --port 8000
      ) ;;
    0:eager)
      ARGV=(
        docker run
        -d
        --name sparkserve-r0-spark-a
        --restart no
        --stop-timeout 30
        --label io.sparkserve.managed=1
        --label io.sparkserve.fingerprint=176696cbc577b9ad2da0cb467bc7787c7d94274990b9f9a91ff0ee6f81e31cbc
        --label io.sparkserve.node=spark-a
        --label io.sparkserve.rank=0
        --label io.sparkserve.role=head
        --network=host
        --ipc=host
        --shm-size 64g
        --ulimit memlock=-1:-1
        --cap-add IPC_LOCK
        --device /dev/infiniband
        --gpus all
        -e HF_HUB_OFFLINE=1
        -e TRANSFORMERS_OFFLINE=1
        -e VLLM_ENGINE_READY_TIMEOUT_S=3600
        -e VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=1800
        -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        -e NCCL_IB_DISABLE=0
        -e NCCL_CUMEM_ENABLE=0
        -e NCCL_NVLS_ENABLE=0
        -e NCCL_IGNORE_CPU_AFFINITY=1
        -e NCCL_DEBUG=WARN
        -e VLLM_USE_BREAKABLE_CUDAGRAPH=0
        -e VLLM_HOST_IP=192.168.200.1
        --mount 'type=bind,source=/models/GLM-5.3-Flash-W4A16-MTP,target=/models/target,readonly'
        --mount "type=bind,source=${DRAFTER_HOST_PATH},target=/models/drafter,readonly"
        --mount 'type=bind,source=/var/cache/sparkserve/vllm,target=/root/.cache/vllm'
        --mount 'type=bind,source=/var/cache/sparkserve/flashinfer,target=/root/.cache/flashinfer'
        --mount 'type=bind,source=/var/cache/sparkserve/triton,target=/root/.triton'
        --entrypoint vllm
        ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e
        serve /models/target
        --served-model-name glm-5.3-flash
        --tensor-parallel-size 2
        --enable-expert-parallel
        --max-model-len 262144
        --max-num-seqs 4
        --kv-cache-dtype fp8_e4m3
        --gpu-memory-utilization 0.795
        --kv-cache-memory-bytes 8G
        --enforce-eager
        --speculative-config '{"method":"dflash","model":"/models/drafter","num_speculative_tokens":7}'
        --distributed-executor-backend mp
        --nnodes 2
        --node-rank 0
        --master-addr 192.168.200.1
        --master-port 29501
        --port 8000
      ) ;;
    1:graphs)
      ARGV=(
        docker run
        -d
        --name sparkserve-r1-spark-b
        --restart no
        --stop-timeout 30
        --label io.sparkserve.managed=1
        --label io.sparkserve.fingerprint=4f9f286fbf5c6d9a2ceec16e496db036145b1d4de8e5106fbe79b70c51b6316f
        --label io.sparkserve.node=spark-b
        --label io.sparkserve.rank=1
        --label io.sparkserve.role=follower
        --network=host
        --ipc=host
        --shm-size 64g
        --ulimit memlock=-1:-1
        --cap-add IPC_LOCK
        --device /dev/infiniband
        --gpus all
        -e HF_HUB_OFFLINE=1
        -e TRANSFORMERS_OFFLINE=1
        -e VLLM_ENGINE_READY_TIMEOUT_S=3600
        -e VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=1800
        -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        -e NCCL_IB_DISABLE=0
        -e NCCL_CUMEM_ENABLE=0
        -e NCCL_NVLS_ENABLE=0
        -e NCCL_IGNORE_CPU_AFFINITY=1
        -e NCCL_DEBUG=WARN
        -e VLLM_USE_BREAKABLE_CUDAGRAPH=0
        -e VLLM_HOST_IP=192.168.200.2
        --mount 'type=bind,source=/models/GLM-5.3-Flash-W4A16-MTP,target=/models/target,readonly'
        --mount "type=bind,source=${DRAFTER_HOST_PATH},target=/models/drafter,readonly"
        --mount 'type=bind,source=/var/cache/sparkserve/vllm,target=/root/.cache/vllm'
        --mount 'type=bind,source=/var/cache/sparkserve/flashinfer,target=/root/.cache/flashinfer'
        --mount 'type=bind,source=/var/cache/sparkserve/triton,target=/root/.triton'
        --entrypoint vllm
        ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e
        serve /models/target
        --served-model-name glm-5.3-flash
        --tensor-parallel-size 2
        --enable-expert-parallel
        --max-model-len 262144
        --max-num-seqs 4
        --kv-cache-dtype fp8_e4m3
        --gpu-memory-utilization 0.795
        --kv-cache-memory-bytes 8G
        --compilation-config '{"cudagraph_mode":"FULL_AND_PIECEWISE","cudagraph_capture_sizes":[1,2,4,8,16,24,32]}'
        --speculative-config '{"method":"dflash","model":"/models/drafter","num_speculative_tokens":7}'
        --distributed-executor-backend mp
        --nnodes 2
        --node-rank 1
        --master-addr 192.168.200.1
        --master-port 29501
        --headless
      ) ;;
    1:eager)
      ARGV=(
        docker run
        -d
        --name sparkserve-r1-spark-b
        --restart no
        --stop-timeout 30
        --label io.sparkserve.managed=1
        --label io.sparkserve.fingerprint=176696cbc577b9ad2da0cb467bc7787c7d94274990b9f9a91ff0ee6f81e31cbc
        --label io.sparkserve.node=spark-b
        --label io.sparkserve.rank=1
        --label io.sparkserve.role=follower
        --network=host
        --ipc=host
        --shm-size 64g
        --ulimit memlock=-1:-1
        --cap-add IPC_LOCK
        --device /dev/infiniband
        --gpus all
        -e HF_HUB_OFFLINE=1
        -e TRANSFORMERS_OFFLINE=1
        -e VLLM_ENGINE_READY_TIMEOUT_S=3600
        -e VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=1800
        -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        -e NCCL_IB_DISABLE=0
        -e NCCL_CUMEM_ENABLE=0
        -e NCCL_NVLS_ENABLE=0
        -e NCCL_IGNORE_CPU_AFFINITY=1
        -e NCCL_DEBUG=WARN
        -e VLLM_USE_BREAKABLE_CUDAGRAPH=0
        -e VLLM_HOST_IP=192.168.200.2
        --mount 'type=bind,source=/models/GLM-5.3-Flash-W4A16-MTP,target=/models/target,readonly'
        --mount "type=bind,source=${DRAFTER_HOST_PATH},target=/models/drafter,readonly"
        --mount 'type=bind,source=/var/cache/sparkserve/vllm,target=/root/.cache/vllm'
        --mount 'type=bind,source=/var/cache/sparkserve/flashinfer,target=/root/.cache/flashinfer'
        --mount 'type=bind,source=/var/cache/sparkserve/triton,target=/root/.triton'
        --entrypoint vllm
        ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e
        serve /models/target
        --served-model-name glm-5.3-flash
        --tensor-parallel-size 2
        --enable-expert-parallel
        --max-model-len 262144
        --max-num-seqs 4
        --kv-cache-dtype fp8_e4m3
        --gpu-memory-utilization 0.795
        --kv-cache-memory-bytes 8G
        --enforce-eager
        --speculative-config '{"method":"dflash","model":"/models/drafter","num_speculative_tokens":7}'
        --distributed-executor-backend mp
        --nnodes 2
        --node-rank 1
        --master-addr 192.168.200.1
        --master-port 29501
        --headless
      ) ;;
  esac
  if [[ "$1" == 0 && -n "${VLLM_API_KEY:-}" ]]; then
    export VLLM_API_KEY
    ARGV=("${ARGV[@]:0:2}" -e VLLM_API_KEY "${ARGV[@]:2}")
  fi
}

RANKS=(0 1)
START_ORDER=(1 0)  # followers first, the head last

# 1. Every node has the drafter (same path) and the cache dirs.
for rank in "${RANKS[@]}"; do
  node="$(node_name "$rank")"
  on_node "$rank" test -f "$DRAFTER_HOST_PATH/mask_embedding.pt" ||
    die "$node: $DRAFTER_HOST_PATH/mask_embedding.pt is missing there (sync the drafter to every node)"
  on_node "$rank" mkdir -p /var/cache/sparkserve/vllm /var/cache/sparkserve/flashinfer /var/cache/sparkserve/triton || fail "$node: cannot create the cache dirs"
done

# 2. Remove the previous ranks everywhere before starting any (a stale rank joins the wrong rendezvous).
for rank in "${RANKS[@]}"; do
  node="$(node_name "$rank")"
  name="$(container_name "$rank")"
  if managed="$(on_node "$rank" docker container inspect -f '{{ index .Config.Labels "io.sparkserve.managed" }}' "$name" 2>/dev/null)"; then
    [[ "$managed" == 1 ]] || die "$node: a container named $name exists and is not sparkserve's; remove it yourself"
    say "$node: stopping the previous $name"
    on_node "$rank" docker stop -t 30 "$name" >/dev/null || fail "$node: docker stop $name failed"
    on_node "$rank" docker rm "$name" >/dev/null || fail "$node: docker rm $name failed"
  fi
done

# 3. Start: followers, then the head; each must be running before the next starts.
for rank in "${START_ORDER[@]}"; do
  node="$(node_name "$rank")"
  name="$(container_name "$rank")"
  node_argv "$rank"
  say "$node: starting $name ($MODE, drafter $DRAFTER_HOST_PATH)"
  on_node "$rank" "${ARGV[@]}" >/dev/null || fail "$node: docker run $name failed"
  running="$(on_node "$rank" docker container inspect -f '{{.State.Running}}' "$name")" ||
    fail "$node: cannot inspect $name"
  [[ "$running" == true ]] || fail "$node: $name is not running (docker logs $name)"
done

say "all 2 ranks started; API http://spark-a.lan:8000 once the head logs 'Application startup complete.' (docker logs -f sparkserve-r0-spark-a)"
