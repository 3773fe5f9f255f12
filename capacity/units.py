"""Unit constants and display helpers. Everything inside the package is SI (bytes, seconds, FLOP/s);
conversion happens only where a number is shown to a person."""

GiB = 1024**3
MiB = 1024**2
GB = 1e9

# Bytes per element of each storage format. Sub-byte formats are fractional; their group scales are
# counted separately by capacity.model.weights.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "mxfp4": 0.5,
    "nvfp4": 0.5,
    "nf4": 0.5,  # bitsandbytes 4-bit (NF4/FP4): packed pairs; the absmax per block of 64 is counted as a scale
}


def gib(n_bytes: float) -> float:
    return n_bytes / GiB
