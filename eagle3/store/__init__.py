"""The store: what a run directory holds and how it is written. The path of every file (paths.py), RunStore
and its typed records (run_store.py), the sample file format (sample_format.py) and the dump protocol shared
with the SGLang plugin (dump_protocol.py), atomic files (fsio.py), the run lock and shard leases (lock.py,
lease.py), sample ids (sample_ids.py), rechecking sample files (verify.py) and which shards failed
(failed_shards.py). The bottom of the library: fsio, sample_format and dump_protocol also run inside SGLang.

May import: eagle3.progress
"""
