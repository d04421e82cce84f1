"""poolctl: GPU inference pools on AWS and GCP through Terraform."""

__version__ = "0.1.0"
