"""The XSpace protobuf schema and its generated Python module (see README.md)."""
