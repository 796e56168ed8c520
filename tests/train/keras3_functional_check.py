"""Checks that a Functional .keras archive dtrain wrote has the layout Keras 3 writes.

Usage:
  /usr/bin/python3 keras3_functional_check.py chain FIXTURE DTRAIN_FILE
  /usr/bin/python3 keras3_functional_check.py residual DTRAIN_FILE

Run by tests/train/keras3_functional_test.cc with Debian's python3-h5py, never with dtrain.

chain: DTRAIN_FILE holds the Sequential model of FIXTURE (a real Keras 3.10 .keras file) rebuilt
as a Functional chain with the same layer names, an Input named "input_layer" and the model
named "functional". Keras 3 (keras/src/saving/saving_lib.py, keras/src/models/functional.py)
writes for such a model exactly the fixture's model.weights.h5 (every group, dataset dtype and
shape, storage layout, filters, attribute) plus the InputLayer's empty group
layers/input_layer/vars (Functional.layers lists InputLayers, Sequential.layers does not), with
the top-level vars named after the model; and a config.json whose layer entries are the
fixture's plus "name" and "inbound_nodes" (Keras 3 nodes: {"args": [__keras_tensor__], "kwargs":
{}}), whose model object is {"module": "keras.src.models.functional", "class_name":
"Functional", "registered_name": "Functional", "build_config": {"input_shape": null}}.

residual: the rules of the same Keras sources for a residual CNN with BatchNormalization and
Add: a weights group per layer (InputLayer included) at layers/<snake-case class>[_<n>] in the
config's layer order; BatchNormalization's four [C] float32 vars (gamma, beta, moving_mean,
moving_variance; the class BatchNormalization with its int axis and a trailing synchronized
flag, also for a synchronized one); Add's build_config a list of its input shapes and its node one list argument;
no build_config for classes Keras 3.10 builds in their constructor; every config layer entry
carrying module, class_name, config, registered_name, name, inbound_nodes; the optimizer holding
iteration, learning_rate and two Adam slots per trainable variable.

Exits 1 with the differences.
"""

import io
import json
import os
import sys
import zipfile

import h5py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from keras3_structure_check import (OPTIONAL_KEYS, compare_compile, compare_trees, snake_case,
                                    tree)

BUILT_AT_CONSTRUCTION = {"InputLayer", "Dropout", "Activation", "ReLU", "MaxPooling2D",
                         "GlobalAveragePooling2D"}


def strip_optional(j):
    if isinstance(j, dict):
        return {k: strip_optional(v) for k, v in j.items() if k not in OPTIONAL_KEYS}
    if isinstance(j, list):
        return [strip_optional(v) for v in j]
    return j


def check_model_object(conf, errors):
    for key, want in (("module", "keras.src.models.functional"), ("class_name", "Functional"),
                      ("registered_name", "Functional"), ("build_config", {"input_shape": None})):
        if conf.get(key) != want:
            errors.append(f"config.json {key} is {conf.get(key)!r}, Keras 3 writes {want!r}")
    keys = set(conf["config"])
    want = {"name", "trainable", "layers", "input_layers", "output_layers"}
    if keys != want:
        errors.append(f"config.json config keys {sorted(keys)} != Keras 3's {sorted(want)}")


def keras_tensor(node_arg, errors, where):
    if not (isinstance(node_arg, dict) and node_arg.get("class_name") == "__keras_tensor__"
            and set(node_arg) == {"class_name", "config"}
            and set(node_arg["config"]) == {"shape", "dtype", "keras_history"}
            and node_arg["config"]["dtype"] == "float32"):
        errors.append(f"{where}: {node_arg} is not a Keras 3 __keras_tensor__")
        return None
    return node_arg["config"]


def check_chain(fixture_path, ours_path, errors):
    fz, oz = zipfile.ZipFile(fixture_path), zipfile.ZipFile(ours_path)
    fnames = sorted(i.filename for i in fz.infolist())
    onames = sorted(i.filename for i in oz.infolist())
    if fnames != onames:
        errors.append(f"zip members {onames} != Keras's {fnames}")
    fconf, oconf = json.loads(fz.read("config.json")), json.loads(oz.read("config.json"))
    check_model_object(oconf, errors)
    if set(oconf) != set(fconf):
        errors.append(f"config.json keys {sorted(oconf)} != Keras's {sorted(fconf)}")
    compare_compile(fconf["compile_config"], oconf.get("compile_config", {}), errors,
                    "config.json compile_config")
    fl, ol = fconf["config"]["layers"], oconf["config"]["layers"]
    if [e["class_name"] for e in fl] != [e["class_name"] for e in ol]:
        errors.append(f"layer classes {[e['class_name'] for e in ol]} != the fixture's "
                      f"{[e['class_name'] for e in fl]}")
        return
    prev = None
    for i, (fe, oe) in enumerate(zip(fl, ol)):
        where = f"config.json layers[{i}] ({oe['class_name']})"
        want_keys = set(fe) | {"name", "inbound_nodes"}
        if set(oe) != want_keys:
            errors.append(f"{where}: keys {sorted(oe)} != Keras's {sorted(want_keys)}")
        # The layer's own config and build_config are the fixture's, value for value.
        if strip_optional(oe["config"]) != strip_optional(fe["config"]):
            errors.append(f"{where}: config {oe['config']} != Keras's {fe['config']}")
        if oe.get("build_config") != fe.get("build_config"):
            errors.append(f"{where}: build_config {oe.get('build_config')} != Keras's "
                          f"{fe.get('build_config')}")
        if oe.get("name") != fe["config"]["name"]:
            errors.append(f"{where}: name {oe.get('name')!r} != its config's")
        nodes = oe.get("inbound_nodes")
        if oe["class_name"] == "InputLayer":
            if nodes != []:
                errors.append(f"{where}: inbound_nodes {nodes} != []")
        elif not (isinstance(nodes, list) and len(nodes) == 1 and isinstance(nodes[0], dict)
                  and set(nodes[0]) == {"args", "kwargs"} and nodes[0]["kwargs"] == {}
                  and len(nodes[0]["args"]) == 1):
            errors.append(f"{where}: inbound_nodes {nodes} is not one Keras 3 node")
        else:
            kt = keras_tensor(nodes[0]["args"][0], errors, where + " inbound_nodes[0].args[0]")
            if kt is not None:
                if kt["keras_history"] != [prev, 0, 0]:
                    errors.append(f"{where}: keras_history {kt['keras_history']} != "
                                  f"{[prev, 0, 0]}")
                if "build_config" in fe and kt["shape"] != fe["build_config"]["input_shape"]:
                    errors.append(f"{where}: input tensor shape {kt['shape']} != Keras's "
                                  f"{fe['build_config']['input_shape']}")
        prev = oe.get("name")
    first, last = ol[0].get("name"), ol[-1].get("name")
    if oconf["config"].get("input_layers") != [first, 0, 0]:
        errors.append(f"input_layers {oconf['config'].get('input_layers')} != {[first, 0, 0]}")
    if oconf["config"].get("output_layers") != [last, 0, 0]:
        errors.append(f"output_layers {oconf['config'].get('output_layers')} != {[last, 0, 0]}")

    fw = h5py.File(io.BytesIO(fz.read("model.weights.h5")), "r")
    ow = h5py.File(io.BytesIO(oz.read("model.weights.h5")), "r")
    expected = tree(fw)
    group = expected["layers/dense/vars"]  # an existing vars group: its attribute's encoding
    kind, shape, _ = group[1]["name"]
    expected["layers/input_layer"] = expected["layers/dense"]
    expected["layers/input_layer/vars"] = ("group", {"name": (kind, shape, first)})
    expected["vars"] = ("group", {"name": (kind, shape, oconf["config"].get("name"))})
    compare_trees(expected, tree(ow), errors, "model.weights.h5")


def check_residual(ours_path, errors):
    oz = zipfile.ZipFile(ours_path)
    conf = json.loads(oz.read("config.json"))
    check_model_object(conf, errors)
    w = h5py.File(io.BytesIO(oz.read("model.weights.h5")), "r")
    used, trainable, seen = {}, 0, set()
    for i, e in enumerate(conf["config"]["layers"]):
        cls = e["class_name"]
        seen.add(cls)
        where = f"config.json layers[{i}] ({cls})"
        keys = {"module", "class_name", "config", "registered_name", "name", "inbound_nodes"}
        if cls not in BUILT_AT_CONSTRUCTION:
            keys.add("build_config")
        if set(e) != keys:
            errors.append(f"{where}: keys {sorted(e)} != Keras 3's {sorted(keys)}")
        base = snake_case(cls)
        n = used.get(base, -1) + 1
        used[base] = n
        path = f"layers/{base}" + (f"_{n}" if n else "") + "/vars"
        if path not in w:
            errors.append(f"model.weights.h5 lacks {path}")
            continue
        if w[path].attrs.get("name") != e["name"]:
            errors.append(f"{path}: name attribute {w[path].attrs.get('name')!r} != {e['name']!r}")
        vs = [w[path][k] for k in sorted(w[path], key=int)]
        if any(v.dtype != "float32" for v in vs):
            errors.append(f"{path}: dtypes {[str(v.dtype) for v in vs]} are not all float32")
        if cls == "SyncBatchNormalization":
            errors.append(f"{where}: Keras 3 has no SyncBatchNormalization (it writes "
                          "BatchNormalization with synchronized: true)")
        if cls == "BatchNormalization":
            conf_bn = e["config"]
            if not isinstance(conf_bn.get("synchronized"), bool) or list(conf_bn)[-1] != \
                    "synchronized":
                errors.append(f"{where}: config lacks Keras 3's trailing synchronized flag")
            if not isinstance(conf_bn.get("axis"), int):
                errors.append(f"{where}: axis {conf_bn.get('axis')!r} is not an int as in Keras 3")
            c = e["build_config"]["input_shape"][-1]
            if [v.shape for v in vs] != [(c,)] * 4:
                errors.append(f"{path}: shapes {[v.shape for v in vs]} != four ({c},)")
            trainable += 2
        elif cls in ("Conv2D", "Dense", "SyncBatchNormalization"):
            trainable += len(vs)
        elif vs:
            errors.append(f"{path}: a {cls} has no variables but the file has {len(vs)}")
        if cls == "Add":
            shapes = e["build_config"]["input_shape"]
            args = e["inbound_nodes"][0]["args"]
            if not (isinstance(shapes, list) and len(shapes) == 2 and isinstance(shapes[0], list)):
                errors.append(f"{where}: build_config {shapes} is not a list of two shapes")
            if not (len(args) == 1 and isinstance(args[0], list) and len(args[0]) == 2):
                errors.append(f"{where}: args {args} is not one list of two tensors")
            else:
                for k, a in enumerate(args[0]):
                    kt = keras_tensor(a, errors, f"{where} args[0][{k}]")
                    if kt is not None and kt["shape"] != shapes[k]:
                        errors.append(f"{where}: tensor {k} shape {kt['shape']} != {shapes[k]}")
    for cls in ("InputLayer", "Conv2D", "BatchNormalization", "ReLU", "Add",
                "GlobalAveragePooling2D", "Dense"):
        if cls not in seen:
            errors.append(f"the model lacks a {cls} (the test must build one)")
    opt = w["optimizer/vars"]
    if len(opt) != 2 + 2 * trainable:
        errors.append(f"optimizer/vars has {len(opt)} variables, Adam keeps 2 + 2 x {trainable}")
    if opt["0"].dtype != "int64" or opt["0"].shape != () or opt["1"].dtype != "float32":
        errors.append("optimizer/vars/0 is not the int64 iteration or 1 the float32 rate")


def main():
    errors = []
    if sys.argv[1] == "chain":
        check_chain(sys.argv[2], sys.argv[3], errors)
    else:
        check_residual(sys.argv[2], errors)
    for e in errors:
        print(e)
    print(f"{len(errors)} differences")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
