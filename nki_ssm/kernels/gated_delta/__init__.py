"""Gated DeltaNet kernels: the recurrent decode (``decode.gdn_decode_step``).
Launch through ``nki_ssm.ops`` (``gated_delta_decode``), which prepares layouts;
``gated_delta_prefill`` still runs on the float64 reference (no chunked kernel yet)."""
