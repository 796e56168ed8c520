"""Checks that a Keras 3 file dtrain wrote has the layout of the real Keras 3 file it imitates.

Usage: /usr/bin/python3 keras3_structure_check.py {keras|h5} FIXTURE DTRAIN_FILE

Run by tests/train/keras3_structure_test.cc with Debian's python3-h5py, so that the layout is
judged by h5py and zipfile, never by dtrain itself. The fixtures are CNNs; dtrain's file holds
the same model without its Conv2D and MaxPooling2D layers, so everything of those layers
(groups, list entries, optimizer variables) is dropped from the fixture's tree before the trees
are compared: every group, dataset (dtype, shape, storage layout, filters) and attribute (HDF5
type class, string encoding and length kind, shape, and the value of string attributes) must be
the same, and config JSON must have the same keys per object. Exits 1 with the differences.
"""

import io
import json
import re
import sys
import zipfile

import h5py

DROPPED = ("conv2d", "max_pooling2d")
# Keys that newer Keras 3 releases add and older ones reject as unknown arguments: dtrain writes
# the set every Keras 3 release loads (Dense quantization_config since 3.11, InputLayer optional
# since 3.13, shared_object_id is Keras's object sharing of identical dtype policies).
OPTIONAL_KEYS = {"quantization_config", "optional", "shared_object_id"}


def dropped(text):
    return any(d in text for d in DROPPED)


def snake_case(name):
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def attr_description(obj, key):
    aid = obj.attrs.get_id(key)
    dt = aid.dtype
    info = h5py.check_string_dtype(dt)
    kind = ("str", info.encoding, "vlen" if info.length is None else "fixed") if info else (
        dt.kind, dt.itemsize)
    value = obj.attrs[key]
    if info is not None:
        if aid.shape == ():
            value = value.decode() if isinstance(value, bytes) else value
            shape = ()
        else:
            value = [v.decode() if isinstance(v, bytes) else v for v in value]
            value = [v for v in value if not dropped(v)]
            shape = (len(value),)
        if key in ("model_config", "training_config", "keras_version"):
            value = "<compared separately>"
    else:
        shape = aid.shape
        value = None
    return (kind, shape, value)


def tree(h5file, rename=lambda p: p):
    out = {}

    def visit(name, obj):
        if dropped(name):
            return
        name = rename(name)
        if name is None:
            return
        attrs = {k: attr_description(obj, k) for k in obj.attrs.keys()}
        if isinstance(obj, h5py.Dataset):
            plist = obj.id.get_create_plist()
            out[name] = ("dataset", str(obj.dtype), obj.shape, plist.get_layout(),
                         plist.get_nfilters(), attrs)
        else:
            out[name] = ("group", attrs)

    out["/"] = ("group", {k: attr_description(h5file, k) for k in h5file.attrs.keys()})
    h5file.visititems(visit)
    return out


def keys_of(j):
    """The key structure of a JSON value: dicts by their keys (recursively), lists by element."""
    if isinstance(j, dict):
        return {k: keys_of(v) for k, v in j.items() if k not in OPTIONAL_KEYS}
    if isinstance(j, list):
        return [keys_of(v) for v in j]
    return type(j).__name__ if j is not None else "null"


def compare_model_json(fixture, ours, errors, where):
    """Same keys at the model level, in its config, per layer class, and in the compile config."""
    fl = {e["class_name"]: e for e in fixture["config"]["layers"]}
    ol = {e["class_name"]: e for e in ours["config"]["layers"]}
    for cls in sorted(set(fl) & set(ol)):
        fe, oe = fl[cls], ol[cls]
        if set(fe) - OPTIONAL_KEYS != set(oe) - OPTIONAL_KEYS:
            errors.append(f"{where}: {cls} entry keys {sorted(oe)} != Keras's {sorted(fe)}")
        fk, ok = keys_of(fe["config"]), keys_of(oe["config"])
        # Values differ by model (units, rates); compare which keys exist and their nesting.
        flat = lambda d: set(d) if isinstance(d, dict) else set()
        if flat(fk) != flat(ok):
            errors.append(f"{where}: {cls} config keys {sorted(flat(ok))} != Keras's "
                          f"{sorted(flat(fk))}")
        for key in flat(fk) & flat(ok):
            if isinstance(fk[key], dict) and fk[key] != ok[key]:
                errors.append(f"{where}: {cls} config[{key!r}] is {ok[key]} but Keras has {fk[key]}")
    missing = {c for c in ("InputLayer", "Dense", "Dropout", "Flatten") if c not in ol}
    if missing:
        errors.append(f"{where}: dtrain's model lacks {missing} (the test must build them)")
    fm = {k: v for k, v in fixture.items() if k != "config"}
    om = {k: v for k, v in ours.items() if k != "config"}
    if set(fm) != set(om):
        errors.append(f"{where}: model keys {sorted(om)} != Keras's {sorted(fm)}")
    fc = {k for k in fixture["config"] if k not in OPTIONAL_KEYS}
    oc = {k for k in ours["config"] if k not in OPTIONAL_KEYS}
    if fc != oc:
        errors.append(f"{where}: model config keys {sorted(oc)} != Keras's {sorted(fc)}")


def compare_compile(fixture, ours, errors, where):
    if set(fixture) != set(ours):
        errors.append(f"{where}: keys {sorted(ours)} != Keras's {sorted(fixture)}")
    fo = fixture.get("optimizer") or fixture.get("optimizer_config")
    oo = ours.get("optimizer") or ours.get("optimizer_config")
    if fo is not None and oo is not None:
        if set(fo) != set(oo):
            errors.append(f"{where}: optimizer keys {sorted(oo)} != Keras's {sorted(fo)}")
        if set(fo["config"]) != set(oo["config"]):
            errors.append(f"{where}: optimizer config keys {sorted(oo['config'])} != Keras's "
                          f"{sorted(fo['config'])}")


def compare_trees(ft, ot, errors, where):
    for path in sorted(set(ft) | set(ot)):
        if path not in ot:
            errors.append(f"{where}: dtrain's file lacks {path} {ft[path]}")
        elif path not in ft:
            errors.append(f"{where}: dtrain's file has {path} {ot[path]}, Keras's does not")
        elif ft[path] != ot[path]:
            errors.append(f"{where}: {path}: dtrain {ot[path]} != Keras {ft[path]}")


def optimizer_renumbering(config, weights):
    """Maps the fixture's optimizer/vars/<i> to dtrain's numbering once the dropped layers' slots
    are gone (iteration and learning_rate first, then the slots, variable by variable)."""
    variables = []  # (dropped?) per model variable, in the model's order
    used = {}
    for e in config["config"]["layers"]:
        if e["class_name"] == "InputLayer":
            continue
        base = snake_case(e["class_name"])
        n = used.get(base, -1) + 1
        used[base] = n
        path = f"layers/{base}" + (f"_{n}" if n else "")
        count = len(weights[path + "/vars"]) if path + "/vars" in weights else 0
        variables += [dropped(path)] * count
    total = len(weights["optimizer/vars"])
    per_var = (total - 2) // len(variables)
    mapping, k = {0: 0, 1: 1}, 2
    for i, is_dropped in enumerate(variables):
        for s in range(per_var):
            if not is_dropped:
                mapping[2 + i * per_var + s] = k
                k += 1
    return mapping


def check_keras(fixture_path, ours_path, errors):
    fz, oz = zipfile.ZipFile(fixture_path), zipfile.ZipFile(ours_path)
    fnames = sorted(i.filename for i in fz.infolist())
    onames = sorted(i.filename for i in oz.infolist())
    if fnames != onames:
        errors.append(f"zip members {onames} != Keras's {fnames}")
    for i in oz.infolist():
        if i.compress_type != fz.getinfo(i.filename).compress_type:
            errors.append(f"{i.filename}: compression {i.compress_type} != Keras's "
                          f"{fz.getinfo(i.filename).compress_type}")
    fmeta, ometa = json.loads(fz.read("metadata.json")), json.loads(oz.read("metadata.json"))
    if set(fmeta) != set(ometa):
        errors.append(f"metadata.json keys {sorted(ometa)} != Keras's {sorted(fmeta)}")
    if not re.fullmatch(r"\d{4}-\d\d-\d\d@\d\d:\d\d:\d\d", ometa.get("date_saved", "")):
        errors.append(f"metadata.json date_saved {ometa.get('date_saved')!r} is not Keras's format")
    fconf, oconf = json.loads(fz.read("config.json")), json.loads(oz.read("config.json"))
    compare_model_json(fconf, oconf, errors, "config.json")
    compare_compile(fconf["compile_config"], oconf.get("compile_config", {}), errors,
                    "config.json compile_config")
    fw = h5py.File(io.BytesIO(fz.read("model.weights.h5")), "r")
    ow = h5py.File(io.BytesIO(oz.read("model.weights.h5")), "r")
    mapping = optimizer_renumbering(fconf, fw)

    def rename(path):
        if path.startswith("optimizer/vars/"):
            i = int(path.rsplit("/", 1)[1])
            return f"optimizer/vars/{mapping[i]}" if i in mapping else None
        return path

    compare_trees(tree(fw, rename), tree(ow), errors, "model.weights.h5")


def check_h5(fixture_path, ours_path, errors):
    f, o = h5py.File(fixture_path, "r"), h5py.File(ours_path, "r")
    compare_trees(tree(f), tree(o), errors, "h5")
    fconf = json.loads(f.attrs["model_config"])
    oconf = json.loads(o.attrs["model_config"])
    compare_model_json(fconf, oconf, errors, "model_config")
    compare_compile(json.loads(f.attrs["training_config"]), json.loads(o.attrs["training_config"]),
                    errors, "training_config")
    if not o.attrs["keras_version"].startswith("3."):
        errors.append(f"keras_version {o.attrs['keras_version']!r} is not a Keras 3 version")


def main():
    mode, fixture, ours = sys.argv[1:4]
    errors = []
    (check_keras if mode == "keras" else check_h5)(fixture, ours, errors)
    for e in errors:
        print(e)
    print(f"{len(errors)} differences")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
