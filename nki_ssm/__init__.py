"""nki_ssm: NKI kernels for the sequence-mixing layers of hybrid SSMs on AWS Trainium2/3."""

__version__ = "0.2.0"
