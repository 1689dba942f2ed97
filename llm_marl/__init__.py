"""The runtime shared by the benchmark and the trainers: hardware checks and native-backend probes."""
