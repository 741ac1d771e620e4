"""An example job that diag can be proven on: a small GPT trained with torch.distributed, with
switches that inject each cause of lost MFU for real.

`diag.example` and `diag.example.launch` import no torch (the CLI imports them);
`diag.example.gpt` is the job each process runs.
"""

from diag.example.launch import ExampleConfig, add_example_arguments, run_example, run_example_command

__all__ = ["ExampleConfig", "add_example_arguments", "run_example", "run_example_command"]
