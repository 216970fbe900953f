from torchdoctor.cli.main import entry

entry()
