"""poolctl on AWS."""
