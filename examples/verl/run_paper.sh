#!/usr/bin/env bash
# The paper's verl runs (Appendix "Hyperparameter Details"): Qwen3-8B on DAPO-Math-17k, global batch 512 prompts,
# PPO mini-batch 128, lr 1e-6, KL loss 0.001 with the k3 estimator (verl: low_var_kl), G = 4 responses per prompt.
#
#   bash examples/verl/run_paper.sh ebpo-topic   [extra hydra overrides...]
#   METHOD: ebpo-topic | ebpo-diff | ebpo-naive | grpo | dr-grpo | dapo | entropymech-clipcov | entropymech-klcov
#
# DRY_RUN=1 prints the command (one argument per line) instead of running it.
# Data (DATA, default data/verl, relative to where you run this):
#   python examples/verl/prepare_data.py --train <annotated records> --val math500 --out data/verl
# Every method runs through `python -m ebpo.integrations.verl` on verl's v1 trainer (trainer.use_v1=true,
# trainer_mode=sync: EBPO state, metrics and samplers), so all share one data order, batch size and optimiser;
# DAPO's dynamic sampling (algorithm.filter_groups) is the v1 replay buffer's (evicted groups refilled).
# Add trainer.use_v1=false to run verl's legacy trainer instead.
set -euo pipefail
METHOD=${1:?usage: run_paper.sh METHOD [overrides...]}
shift
MODEL=${MODEL:-Qwen/Qwen3-8B}
DATA=${DATA:-data/verl}
NGPUS=${NGPUS:-8}
NNODES=${NNODES:-1}
MAX_RESPONSE=${MAX_RESPONSE:-8192}
ROLLOUT=${ROLLOUT:-vllm}
export VERL_USE_EXTERNAL_MODULES=ebpo.integrations.verl   # registers ebpo / dr_grpo / jspo in every process

COMMON=(
  data.train_files="$DATA/train.parquet"
  data.val_files="$DATA/val.parquet"
  data.train_batch_size=512
  data.max_prompt_length=1024
  data.max_response_length="$MAX_RESPONSE"
  data.filter_overlong_prompts=True
  actor_rollout_ref.model.path="$MODEL"
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=128
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
  actor_rollout_ref.actor.use_kl_loss=True
  actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.rollout.name="$ROLLOUT"
  actor_rollout_ref.rollout.n=4
  actor_rollout_ref.rollout.temperature=1.0
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4
  algorithm.use_kl_in_reward=False
  trainer.project_name=ebpo
  trainer.experiment_name="qwen3-8b-$METHOD"
  trainer.n_gpus_per_node="$NGPUS"
  trainer.nnodes="$NNODES"
  trainer.logger='["console","tensorboard"]'
  trainer.save_freq=50
  trainer.test_freq=50
  trainer.total_epochs=100
)
# GRPO's loss: PPO clip 0.2, per-sequence token mean then mean over sequences (docs/design.md §3)
GRPO_LOSS=(actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean actor_rollout_ref.actor.clip_ratio_low=0.2
  actor_rollout_ref.actor.clip_ratio_high=0.2)
EBPO=(algorithm.adv_estimator=ebpo "${GRPO_LOSS[@]}")
TOPIC_SAMPLER=(data.shuffle=False +data.sampler.class_path=pkg://ebpo.integrations.verl
  +data.sampler.class_name=TopicSampler)
DIFF_SAMPLER=(data.shuffle=False +data.sampler.class_path=pkg://ebpo.integrations.verl
  +data.sampler.class_name=DifficultySampler)

ENTRY=(python -m ebpo.integrations.verl)
case "$METHOD" in
  ebpo-topic) ARGS=("${EBPO[@]}" "${TOPIC_SAMPLER[@]}") ;;
  ebpo-diff) ARGS=("${EBPO[@]}" "${DIFF_SAMPLER[@]}") ;;
  ebpo-naive) ARGS=("${EBPO[@]}" data.shuffle=True data.seed=1) ;;
  grpo) ARGS=(algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=True "${GRPO_LOSS[@]}" data.seed=1) ;;
  grpo-diff) ARGS=(algorithm.adv_estimator=grpo "${GRPO_LOSS[@]}" "${DIFF_SAMPLER[@]}") ;;
  dr-grpo)  # A = r - mean, loss = sum of token losses / (max length * sequences), no KL
    ARGS=(algorithm.adv_estimator=dr_grpo actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm
      actor_rollout_ref.actor.use_kl_loss=False data.seed=1) ;;
  dapo)  # clip-higher, token-mean, dynamic sampling (v1 replay buffer), soft overlong punishment, no KL
    ARGS=(algorithm.adv_estimator=grpo actor_rollout_ref.actor.loss_agg_mode=token-mean
      actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28
      actor_rollout_ref.actor.use_kl_loss=False
      algorithm.filter_groups.enable=True algorithm.filter_groups.metric=acc
      reward.reward_manager.name=dapo
      +reward.reward_kwargs.max_resp_len="$MAX_RESPONSE"
      +reward.reward_kwargs.overlong_buffer_cfg.enable=True
      +reward.reward_kwargs.overlong_buffer_cfg.len=4096
      +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
      +reward.reward_kwargs.overlong_buffer_cfg.log=False
      data.seed=1) ;;
  entropymech-clipcov)  # Clip-Cov: ratio 2e-4, bounds (1, 5)
    ARGS=(algorithm.adv_estimator=grpo "${GRPO_LOSS[@]}" actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov
      actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.0002 actor_rollout_ref.actor.policy_loss.clip_cov_lb=1.0
      actor_rollout_ref.actor.policy_loss.clip_cov_ub=5.0 data.seed=1) ;;
  entropymech-klcov)  # KL-Cov: top 2e-3 of tokens by covariance, k = 1
    ARGS=(algorithm.adv_estimator=grpo "${GRPO_LOSS[@]}" actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov
      actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.002 actor_rollout_ref.actor.policy_loss.ppo_kl_coef=1.0
      data.seed=1) ;;
  *) echo "unknown METHOD $METHOD" >&2; exit 2 ;;
esac
# topic-clustered and shuffled runs: up to 1000 steps (best checkpoint by maj@16 on validation);
# the curriculum: one epoch, easy to hard, final checkpoint
case "$METHOD" in
  *-diff) LENGTH=(trainer.total_training_steps=null) ;;
  *) LENGTH=(trainer.total_training_steps=1000) ;;
esac
if [[ "$METHOD" == *-diff ]]; then COMMON=("${COMMON[@]/trainer.total_epochs=100/trainer.total_epochs=1}"); fi
if [[ "${DRY_RUN:-0}" == 1 ]]; then printf '%s\n' "${ENTRY[@]}" "${COMMON[@]}" "${ARGS[@]}" "${LENGTH[@]}" "$@"; exit 0; fi
exec "${ENTRY[@]}" "${COMMON[@]}" "${ARGS[@]}" "${LENGTH[@]}" "$@"
