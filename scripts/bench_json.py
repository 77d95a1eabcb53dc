"""What bench-lib.sh's runs left: each configuration's JSON reports, a base build's beside."""
import glob
import json
import os


def runs(out):
    """(name, [report, ...]) per configuration of `out`, sorted, `base:NAME` after NAME."""
    files = glob.glob(os.path.join(out, "*.jsonl"))
    dec = json.JSONDecoder()
    for f in sorted(files, key=lambda f: (os.path.basename(f).removeprefix("base:"), "base:" in f)):
        s, i, reports = open(f).read(), 0, []
        while True:
            while i < len(s) and s[i].isspace():
                i += 1
            if i >= len(s):
                break
            v, i = dec.raw_decode(s, i)
            reports.append(v)
        yield os.path.basename(f)[:-6], reports
