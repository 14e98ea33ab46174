"""float64 NumPy references: the executable specification of every op.

numpy (and ml_dtypes for bf16 inputs) only; signatures in docs/contracts.md,
"References". Import the submodules:

    short_conv    short_conv_recurrent / short_conv_prefill / short_conv_decode
    mamba2_ssd    ssd_recurrent / ssd_chunked / ssd_decode (+ ssd_dt, the dt transform)
    gated_delta   gated_delta_recurrent / gated_delta_chunked / gated_delta_decode
    inputs        realistic random inputs per family (make_*_inputs, make_*_decode_inputs)
    metrics       rel_fro, max_abs_scaled (float64, 0/0 = 0)
    shapes        the model shapes the project is judged on, as dataclasses
    testing       checks the tests of every layer share (named slots, padding rows,
                  untouched arrays, two forms agreeing)
"""
