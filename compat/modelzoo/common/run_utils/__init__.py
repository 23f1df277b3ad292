"""The 1.8/1.9 command line of Model Zoo ``run.py`` scripts (``cli_parser``) and its device
and execution-strategy names (``utils``)."""
