"""The CPU block sizes of the model's loops, in one place: rows and vocabulary entries per block.

Each loop on the CPU works in blocks chosen so that its temporaries stay in cache (or are reused
from the allocator) between the operations that read them; on GPUs one block covers everything,
since blocks would only add kernel launches (the GPU kernel's tiles are its own, in
:mod:`rescorer.model.lse_kernel`). The sizes were measured on 2 cores at the paper's
sizes; kept side by side so that the rows and the vocabulary of one loop are read together.
Callers read them through the module (``block_sizes.NAME``) when they run, so a test may set one.
"""

# The no-gradient output layer of the padded path (RNNEncoderDecoder.token_logprobs), in blocks of
# rows × vocabulary entries: small enough for a block of logits to stay in cache between the
# matmul and its log-sum-exp, large enough for efficient matmuls. Measured on 2 cores, paper
# sizes: 28 µs/token against 61 µs for whole-row blocks. The vocabulary side is also that of the
# per-block log-sum-exps of rescorer.model.normalizer.log_normalizer (CPU autocast).
CPU_OUTPUT_BLOCK_ROWS = 512
CPU_OUTPUT_BLOCK_VOCAB = 2048

# Scoring (no gradient) on CPU over prefix trees: blocks for the in-place log-sum-exp, whose
# buffer of logits (1024 × 512 floats, 2 MB) stays in the cores' L2 through the matmul, exp and
# sum. Measured on 2 cores, paper sizes: 19 µs/row against 22 µs with 512 × 2048 blocks.
CPU_SCORING_BLOCK_ROWS = 1024
CPU_SCORING_BLOCK_VOCAB = 512

# Prefix-tree levels run in pieces of this many nodes on CPU, so the step's temporaries are reused
# from the allocator instead of being fresh (page-faulting) buffers.
CPU_TREE_STEP_ROWS = 512

# Generation (beam search) on CPU: rows per block of logits for the top-k and log-sum-exp; a block
# of 128 rows × 15,000 words is 7.7 MB, near the cores' share of cache.
CPU_GENERATION_BLOCK_ROWS = 128
# Words per chunk of top_k_by_chunks: on the CPU, torch.topk's per-row selection over 15,001 logits
# cost more than the vocabulary matmul itself (benchmarks/propose_speed.py, docs/proposals.md).
TOP_K_CHUNK = 64


# Training's matmul shapes where its matmuls run in bf16 or fp16 on the CPU (rescorer.model.gru.shape_multiple):
# rounded up to a small fixed set, so that after a few updates no update meets a shape it has not met
# before. oneDNN, which runs the CPU's bf16 matmuls, builds (JIT-compiles) a kernel for each new shape:
# about 17 ms each on a CPU with AMX, and exact shapes made 532-618 distinct ones in 40 updates, new ones
# in every update. Each padded row or position holds its state or scores nothing and gets exactly zero
# gradient, so the updates are the exact shapes' (1 = exact shapes). The encoder's rows still reading at
# a time step, a multiple of:
TRAIN_STEP_ROWS = 8
# The rows of the encoder's packed time steps (K of its recurrent weights' gradients), a multiple of:
TRAIN_PACKED_ROWS = 64
# The target positions the output layer scores (its matmuls' rows, K of its gradients), a multiple of
# (64, a full minibatch's row: minibatches grouped by target length then score what the static step
# scores, B x T; 16 and 32 still met new shapes after 30 updates of benchmarks/train_speed.py's):
TRAIN_POSITIONS = 64
# In fp32 MKL builds nothing per shape and the padding is only extra work (6% of a d = 256 update on one
# thread: docs/training-speed.md), so fp32 keeps the exact shapes unless this is set (tests, benchmarks).
TRAIN_FIXED_SHAPES_IN_FP32 = False
