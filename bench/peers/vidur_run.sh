#!/bin/bash
# Vidur (microsoft/vidur @ 7d47513) on the reference workload; runs from any directory.
cd ${PEERS_DIR:-/work/peers}/vidur || exit 1
exec ${PEERS_DIR:-/work/peers}/vidurenv/bin/python -m vidur.main \
  --seed 0 \
  --cluster_config_num_replicas 1 \
  --replica_config_model_name meta-llama/Meta-Llama-3-8B \
  --replica_config_device h100 --replica_config_network_device h100_dgx \
  --replica_config_tensor_parallel_size 1 --replica_config_num_pipeline_stages 1 \
  --global_scheduler_config_type round_robin \
  --replica_scheduler_config_type vllm \
  --vllm_scheduler_config_batch_size_cap 128 --vllm_scheduler_config_max_tokens_in_batch 8192 \
  --vllm_scheduler_config_block_size 16 --vllm_scheduler_config_num_blocks 27703 \
  --request_generator_config_type synthetic --synthetic_request_generator_config_num_requests 10000 \
  --synthetic_request_generator_config_seed 0 \
  --length_generator_config_type fixed --fixed_request_length_generator_config_prefill_tokens 1024 \
  --fixed_request_length_generator_config_decode_tokens 256 --fixed_request_length_generator_config_max_tokens 4096 \
  --interval_generator_config_type poisson --poisson_request_interval_generator_config_qps 3.800852 \
  --poisson_request_interval_generator_config_seed 0 \
  --execution_time_predictor_config_type random_forrest \
  --random_forrest_execution_time_predictor_config_prediction_max_prefill_chunk_size 4096 \
  --random_forrest_execution_time_predictor_config_prediction_max_batch_size 128 \
  --random_forrest_execution_time_predictor_config_prediction_max_tokens_per_request 4096 \
  --random_forrest_execution_time_predictor_config_num_estimators 250 --random_forrest_execution_time_predictor_config_max_depth 16 \
  --random_forrest_execution_time_predictor_config_min_samples_split 2 --random_forrest_execution_time_predictor_config_k_fold_cv_splits 2 \
  --no-metrics_config_store_token_completion_metrics --no-metrics_config_store_batch_metrics \
  --no-metrics_config_store_utilization_metrics --no-metrics_config_store_operation_metrics \
  --no-metrics_config_enable_chrome_trace --no-metrics_config_store_plots --no-metrics_config_write_json_trace \
  --metrics_config_output_dir ${PEERS_DIR:-/work/peers}/vidur_out --metrics_config_cache_dir ${PEERS_DIR:-/work/peers}/vidur_cache \
  "$@"
