"""Shape buckets: powers of two with a floor, never smaller than the batch."""
from hypothesis import given, strategies as st

from nki_ssm.ops.launch.buckets import MIN_TOKEN_BUCKET, seq_bucket, token_bucket


@given(st.integers(0, 1 << 20))
def test_token_bucket_is_the_next_power_of_two_at_least_the_floor(n):
    b = token_bucket(n)
    assert b >= max(n, MIN_TOKEN_BUCKET) and b & (b - 1) == 0
    assert b == MIN_TOKEN_BUCKET or b // 2 < n


@given(st.integers(1, 1 << 12))
def test_seq_bucket_is_the_next_power_of_two(n):
    b = seq_bucket(n)
    assert b >= n and b & (b - 1) == 0 and (b == 1 or b // 2 < n)


def test_buckets_at_serving_sizes():
    assert [token_bucket(n) for n in (0, 1, 128, 129, 2048, 2049)] == [128, 128, 128, 256, 2048, 4096]
    assert [seq_bucket(n) for n in (1, 2, 3, 32, 33, 512)] == [1, 2, 4, 32, 64, 512]
