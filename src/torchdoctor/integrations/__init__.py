"""torchdoctor inside the tools people train with. Each module imports its framework, so
import only the one you use:

    torchdoctor.integrations.huggingface.TorchdoctorCallback   transformers Trainer
    torchdoctor.integrations.lightning.TorchdoctorCallback     Lightning Trainer
    torchdoctor.integrations.notebook                           %load_ext torchdoctor

See docs/integrations.md.
"""
