"""An example job that diag can be proven on: a small GPT trained with torch.distributed, with
switches that inject each cause of lost MFU for real.

`diag.capture.example` and `diag.capture.example.launch` import no torch (the CLI imports them);
`diag.capture.example.gpt` is the job each process runs.
"""

from diag.capture.example.launch import ExampleConfig, add_example_arguments, run_example, run_example_command

__all__ = ["ExampleConfig", "add_example_arguments", "run_example", "run_example_command"]
