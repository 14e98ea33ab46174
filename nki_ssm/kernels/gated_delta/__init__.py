"""Gated DeltaNet kernels: the recurrent decode (``decode.gdn_decode_step``) and the
chunked WY / UT prefill (``chunk.gdn_chunk_prefill``). Launch them through
``nki_ssm.ops`` (``gated_delta_decode`` / ``gated_delta_prefill``), which prepares layouts."""
