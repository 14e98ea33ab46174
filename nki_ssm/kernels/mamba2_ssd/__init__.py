"""Mamba-2 SSD kernels: chunked prefill (``chunk.ssd_chunk_prefill``) and the
selective state update (``decode.ssd_decode_step``). Launch them through
``nki_ssm.ops`` (``ssd_prefill`` / ``ssd_decode``), which prepares layouts."""
