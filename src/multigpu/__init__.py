"""multigpu: the shared code of the course "Training deep learning models on multiple GPUs".

Notebooks import from here instead of pasting code. Modules are organised by topic:
``devices`` (GPU or CPU mode), ``data`` (the JPEG image data set and its loaders), ``models``
(AlexNet), ``train`` and ``meters`` (one training loop for 1..N workers), ``launch`` (starting
worker processes with a time limit), ``notebook`` (helpers for notebook cells) and ``cli``.
"""

__version__ = "0.1.0"
