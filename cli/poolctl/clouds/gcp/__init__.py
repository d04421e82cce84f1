"""poolctl on GCP."""
