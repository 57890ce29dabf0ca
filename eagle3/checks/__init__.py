"""The checks a run can ask for before it spends hours: `eagle3 doctor` on a GPU node (doctor.py: SGLang, the
plugin, the layer mapping, free space, one sample through the server against the transformers engine) and the
pipeline's pre-flight (preflight.py: what a later stage would refuse on this store, refused before the first).
Above the stages' packages, whose questions they ask; below the command line and tasks/preflight.py.

May import: eagle3.config, eagle3.device, eagle3.target, eagle3.store, eagle3.data, eagle3.serving, eagle3.extract,
eagle3.convert, eagle3.draft
"""
