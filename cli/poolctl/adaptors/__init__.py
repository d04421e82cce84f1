"""The third-party cloud SDKs, each behind one small module that imports it on first use
(SkyPilot's `sky/adaptors` is the model): `aws` (boto3, botocore) and `gcp` (google-cloud-*,
google-auth). Everything else imports these adaptors at module top and never the SDKs, so
importing any of poolctl's modules loads no SDK: `poolctl --help` and the commands that only
read files stay fast (tests/unit/test_cli.py checks both).
"""
