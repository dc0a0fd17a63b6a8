"""Check Label Studio tasks against a labeling config with Label Studio's own SDK (``label-studio-sdk``), run by the
Python of its own venv (tests/conftest.py ``label_studio_python``): ``python labelstudio_check.py CONFIG TASKS``.
Prints ``{"tasks": N, "errors": [...]}``: the config's own validation, then every task's data and every region of
its annotations and predictions (``LabelInterface.validate_prediction``: fields, names, types, value ranges)."""

import json
import sys

from label_studio_sdk.label_interface import LabelInterface

config, tasks = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
interface = LabelInterface(config)
interface.validate()
errors = []
for number, task in enumerate(tasks):
    for tag in interface.objects:  # the first check of validate_task (which then calls validate_prediction() bare)
        if tag.value_is_variable and task["data"].get(tag.value_name) is None:
            errors.append(f"task {number}: no data.{tag.value_name}")
    for kind in ("annotations", "predictions"):
        for item in task.get(kind, []):
            found = interface.validate_prediction(item, return_errors=True)  # the one check of both kinds
            if found is not True and found:
                errors += [f"task {number} {kind}: {error[:300]}" for error in found]
print(json.dumps({"tasks": len(tasks), "errors": errors}))
