"""The one model of `poolctl.yaml` and its loading, a package of modules: `shapes`
(string shapes, strict scalars, the models' base), `aws` and `gcp` (the placements and
backends), `model` (the pool and the file), `reader` (the YAML reader with line numbers)
and `loading` (finding, parsing, one line per problem, the JSON Schema). What the rest of
poolctl uses is named here.
"""

from poolctl.config.aws import AwsCapacity, AwsNetwork, AwsPlacement
from poolctl.config.gcp import GcpCapacity, GcpPlacement
from poolctl.config.loading import find_config, json_schema, load_config, parse_config
from poolctl.config.model import Config, Model, Pool, Slo, Target
from poolctl.config.reader import MAX_FILE_BYTES, LineLoader, format_loc
from poolctl.config.shapes import DTYPE_BYTES, FP4_DTYPES, Loc

__all__ = [
    "AwsCapacity",
    "AwsNetwork",
    "AwsPlacement",
    "Config",
    "DTYPE_BYTES",
    "FP4_DTYPES",
    "GcpCapacity",
    "GcpPlacement",
    "LineLoader",
    "Loc",
    "MAX_FILE_BYTES",
    "Model",
    "Pool",
    "Slo",
    "Target",
    "find_config",
    "format_loc",
    "json_schema",
    "load_config",
    "parse_config",
]
