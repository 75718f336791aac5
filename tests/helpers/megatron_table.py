"""The Megatron-LM scaling table (Narayanan et al. 2021, arXiv:2104.04473, Table 1): its GPT shapes and published
throughput, the rows tests/integration/test_megatron_table.py checks the cost model against."""

SEQ, VOCAB = 2048, 51200

# name, heads, hidden, layers, tp, pp, dp, gpus, micro-batch, global batch, published TFLOP/s per GPU
ROWS = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 32, 16, 512, 137),
    ("3.6B", 32, 3072, 30, 2, 1, 32, 64, 16, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 32, 128, 16, 512, 142),
    ("18B", 48, 6144, 40, 8, 1, 32, 256, 8, 1024, 135),
    ("39B", 64, 8192, 48, 8, 2, 32, 512, 4, 1536, 138),
    ("76B", 80, 10240, 60, 8, 4, 32, 1024, 2, 1792, 140),
    ("145B", 96, 12288, 80, 8, 8, 24, 1536, 2, 2304, 148),
    ("310B", 128, 16384, 96, 8, 16, 15, 1920, 1, 2160, 155),
    ("530B", 128, 20480, 105, 8, 35, 9, 2520, 1, 2520, 163),
    ("1T", 160, 25600, 128, 8, 64, 6, 3072, 1, 3072, 163),
]
