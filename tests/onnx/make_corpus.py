"""Writes the small ONNX files memc's import tests use (run once; the files are committed).

tests/onnx/errors/*.onnx: each must be refused with a diagnostic (tests/onnx.rs), among them an
integer graph output, a Cast of an integer input to float and an input dim of size 0;
tests/onnx/dynamic_batch.onnx: a tiny CNN whose batch dim is symbolic (`N`) and whose
flatten target is computed by Shape -> Gather -> Unsqueeze -> Concat;
tests/onnx/attention_mix.onnx: LayerNormalization, MatMul, Split, Transpose, Softmax, an
Erf-based GELU, Pow, ReduceMean, Sqrt, Div, Flatten and a Gemm with alpha and beta (opset 17);
tests/onnx/resize.onnx: nearest Resize by scales (half_pixel) and by sizes (asymmetric, floor)
around a Conv, and an asymmetric constant Pad;
tests/onnx/softplus.onnx: Softplus of a projection widened 40x, so that inputs reach where
exp(x) overflows f32;
tests/onnx/flatten_negative.onnx: Flatten with axis -1 ([2, 3, 4, 5] -> [24, 5]) before a MatMul;
tests/onnx/reduce_noop.onnx: ReduceSum without axes and with noop_with_empty_axes = 1 (the
identity) after a MatMul (onnxruntime 1.20 cannot run it: tests/onnx.rs checks the import);
tests/onnx/conv_volume.onnx: a grouped, strided, dilated, padded 3-D Conv with bias, a ReLU, a
3-D ConvTranspose with bias, a grouped 3-D ConvTranspose with pads and output_padding, a 3-D
MaxPool and a strided, padded 3-D AveragePool (padding not counted);
tests/onnx/conv_line.onnx: a strided, dilated, padded 1-D Conv and a strided 1-D ConvTranspose;
tests/onnx/reduce_family.onnx: ReduceMin, ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSumExp
and ReduceLogSum (of a Sigmoid) after a MatMul;
tests/onnx/select_shapes.onnx: an exporter's attention pattern over static shapes (heads split by
a Reshape whose target is Shape -> Gather -> Unsqueeze -> Concat, a causal mask from Range and
Less folded to a constant, Where on it and on a run-time Greater, Clip with input bounds, one
missing), Slice of a computed value, variadic Max and Min, Reciprocal, a class token Expand-ed
to the batch and concatenated, CastLike and a Cast of a mask to float;
tests/onnx/bool_output.onnx: a comparison as a graph output (a 0/1 mask);
tests/onnx/errors/bool_output.onnx, errors/slice_step.onnx: a float value declared as a boolean
graph output and a strided Slice of a computed value, refused; errors/loss_negative_ignore.onnx: a
SoftmaxCrossEntropyLoss whose ignore_index (-1) is not a class, refused; errors/resize_crop.onnx:
a tf_crop_and_resize Resize, refused;
tests/onnx/interpolate.onnx: see `interpolate`.
"""
import os

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(1)


def model(nodes, inputs, outputs, inits=(), opset=13, domain_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in domain_opsets]
    return helper.make_model(graph, opset_imports=opsets, producer_name="memc-tests")


def tensor(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def weight(name, shape):
    return numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)


def save(m, name):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(m.SerializeToString())


def relu_model(op="Relu", **kw):
    return model([helper.make_node(op, ["x"], ["y"], name="act")], [tensor("x", [1, 4])], [tensor("y", [1, 4])], **kw)


def conv_models():
    mk = helper.make_node
    nodes = [
        mk("Conv", ["x", "w1", "b1"], ["c"], name="conv", group=2, strides=[2, 1, 1],
           pads=[1, 0, 1, 1, 0, 1], dilations=[1, 2, 1]),
        mk("Relu", ["c"], ["r"], name="act"),
        mk("ConvTranspose", ["r", "w2", "b2"], ["u"], name="up", strides=[2, 2, 2]),
        mk("ConvTranspose", ["u", "w3"], ["t"], name="up_grouped", group=3, strides=[2, 2, 2],
           pads=[1, 1, 1, 1, 1, 1], output_padding=[1, 0, 1]),
        mk("MaxPool", ["t"], ["m"], name="max", kernel_shape=[2, 2, 2], strides=[2, 2, 2]),
        mk("AveragePool", ["m"], ["y"], name="avg", kernel_shape=[3, 3, 3], strides=[1, 2, 1],
           pads=[1, 1, 1, 1, 1, 1]),
    ]
    inits = [weight("w1", [4, 1, 3, 2, 3]), weight("b1", [4]), weight("w2", [4, 3, 2, 2, 2]),
             weight("b2", [3]), weight("w3", [3, 1, 3, 3, 3])]
    save(model(nodes, [tensor("x", [1, 2, 6, 5, 4])], [tensor("y", [1, 3, 6, 3, 8])], inits), "conv_volume.onnx")
    nodes = [
        mk("Conv", ["x", "w1"], ["c"], name="conv", strides=[2], pads=[1, 1], dilations=[2]),
        mk("ConvTranspose", ["c", "w2"], ["y"], name="up", strides=[3]),
    ]
    inits = [weight("w1", [4, 3, 3]), weight("w2", [4, 2, 3])]
    save(model(nodes, [tensor("x", [2, 3, 10])], [tensor("y", [2, 2, 12])], inits), "conv_line.onnx")


def main():
    good = relu_model().SerializeToString()
    with open(os.path.join(HERE, "errors/truncated.onnx"), "wb") as f:
        f.write(good[: len(good) // 2])
    with open(os.path.join(HERE, "errors/not_protobuf.onnx"), "wb") as f:
        f.write(b"this is a text file, not an ONNX model\n")
    save(relu_model("TopK"), "errors/unsupported_op.onnx")
    save(relu_model(opset=3), "errors/old_opset.onnx")
    save(
        model([helper.make_node("Relu", ["x"], ["y"], name="act")], [tensor("x", [1, 4], TensorProto.FLOAT16)], [tensor("y", [1, 4], TensorProto.FLOAT16)]),
        "errors/float16_input.onnx",
    )
    half = numpy_helper.from_array(np.ones([4], dtype=np.float16), "b")
    save(
        model([helper.make_node("Add", ["x", "b"], ["y"], name="add")], [tensor("x", [1, 4])], [tensor("y", [1, 4])], [half]),
        "errors/float16_weight.onnx",
    )
    save(
        model([helper.make_node("Relu", ["nowhere"], ["y"], name="act")], [tensor("x", [1, 4])], [tensor("y", [1, 4])]),
        "errors/undefined_value.onnx",
    )
    custom = helper.make_node("FusedGelu", ["x"], ["y"], name="gelu", domain="com.microsoft")
    save(
        model([custom], [tensor("x", [1, 4])], [tensor("y", [1, 4])], domain_opsets=[("com.microsoft", 1)]),
        "errors/custom_domain.onnx",
    )
    resize = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="nearest")
    save(
        model([resize], [tensor("x", [1, 2, 5, 5]), tensor("scales", [4])], [tensor("y", [1, 2, 10, 10])]),
        "errors/computed_scales.onnx",
    )
    cast = helper.make_node("Cast", ["x"], ["y"], name="to_half", to=TensorProto.FLOAT16)
    save(
        model([cast], [tensor("x", [1, 4])], [tensor("y", [1, 4], TensorProto.FLOAT16)]),
        "errors/cast_to_float16.onnx",
    )
    # A tiny CNN with a symbolic batch and a computed flatten target.
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Shape", ["p"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="batch", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="batch1"),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], name="target", axis=0),
        helper.make_node("Reshape", ["p", "target"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], name="softmax", axis=1),
    ]
    inits = [
        weight("w", [4, 3, 3, 3]),
        weight("b", [4]),
        weight("fc_w", [5, 64]),
        weight("fc_b", [5]),
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "axes"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus1"),
    ]
    save(model(nodes, [tensor("x", ["N", 3, 8, 8])], [tensor("prob", ["N", 5])], inits), "dynamic_batch.onnx")
    mk = helper.make_node
    nodes = [
        mk("LayerNormalization", ["x", "ln_s", "ln_b"], ["ln"], name="ln", axis=-1, epsilon=1e-5),
        mk("MatMul", ["ln", "qkv_w"], ["h"], name="qkv"),
        mk("Split", ["h", "sizes"], ["q", "k", "v"], name="split", axis=-1),
        mk("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        mk("MatMul", ["q", "kt"], ["s"], name="scores"),
        mk("Softmax", ["s"], ["p"], name="softmax", axis=-1),
        mk("MatMul", ["p", "v"], ["o"], name="attend"),
        mk("Div", ["o", "sqrt2"], ["o_s"], name="gelu_div"),
        mk("Erf", ["o_s"], ["e"], name="gelu_erf"),
        mk("Add", ["e", "one"], ["e1"], name="gelu_add"),
        mk("Mul", ["o", "e1"], ["g0"], name="gelu_mul"),
        mk("Mul", ["g0", "half"], ["g"], name="gelu_half"),
        mk("Pow", ["g", "two"], ["sq"], name="square"),
        mk("ReduceMean", ["sq"], ["ms"], name="mean_square", axes=[-1], keepdims=1),
        mk("Add", ["ms", "eps"], ["ms_e"], name="eps"),
        mk("Sqrt", ["ms_e"], ["rms"], name="rms"),
        mk("Div", ["g", "rms"], ["n"], name="normalize"),
        mk("Flatten", ["n"], ["f"], name="flatten", axis=1),
        mk("Gemm", ["f", "out_w", "out_b"], ["y"], name="head", alpha=0.5, beta=2.0),
    ]
    scalar = lambda v, name: numpy_helper.from_array(np.array(v, dtype=np.float32), name)
    inits = [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, [8]).astype(np.float32), "ln_s"),
        weight("ln_b", [8]),
        weight("qkv_w", [8, 12]),
        numpy_helper.from_array(np.array([4, 4, 4], dtype=np.int64), "sizes"),
        scalar(1.4142135, "sqrt2"),
        scalar(1.0, "one"),
        scalar(0.5, "half"),
        scalar(2.0, "two"),
        scalar(1e-5, "eps"),
        weight("out_w", [24, 3]),
        weight("out_b", [3]),
    ]
    save(model(nodes, [tensor("x", [2, 6, 8])], [tensor("y", [2, 3])], inits, opset=17), "attention_mix.onnx")
    floats = lambda v, name: numpy_helper.from_array(np.array(v, dtype=np.float32), name)
    ints = lambda v, name: numpy_helper.from_array(np.array(v, dtype=np.int64), name)
    nodes = [
        mk("Resize", ["x", "", "scales"], ["u"], name="up2", mode="nearest"),
        mk("Pad", ["u", "pads", "pad_value"], ["up"], name="pad", mode="constant"),
        mk("Conv", ["up", "w"], ["c"], name="conv", kernel_shape=[3, 3], pads=[0, 1, 1, 0]),
        mk("Resize", ["c", "", "", "sizes"], ["y"], name="up3", mode="nearest",
           coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    ]
    inits = [
        floats([1, 1, 2, 2], "scales"),
        ints([0, 0, 1, 0, 0, 0, 0, 1], "pads"),
        floats(0.5, "pad_value"),
        weight("w", [3, 2, 3, 3]),
        ints([1, 3, 24, 24], "sizes"),
    ]
    save(model(nodes, [tensor("x", [1, 2, 4, 4])], [tensor("y", [1, 3, 24, 24])], inits), "resize.onnx")
    reflect = mk("Pad", ["x", "pads"], ["y"], name="reflect", mode="reflect")
    save(
        model([reflect], [tensor("x", [1, 2, 4, 4])], [tensor("y", [1, 2, 5, 5])], [ints([0, 0, 1, 0, 0, 0, 0, 1], "pads")]),
        "errors/pad_reflect.onnx",
    )
    crop = mk("Resize", ["x", "roi", "", "sizes"], ["y"], name="crop", mode="linear",
              coordinate_transformation_mode="tf_crop_and_resize")
    save(
        model([crop], [tensor("x", [1, 2, 4, 4])], [tensor("y", [1, 2, 3, 3])],
              [floats([0, 0, 0.2, 0.2, 1, 1, 0.8, 0.8], "roi"), ints([1, 2, 3, 3], "sizes")]),
        "errors/resize_crop.onnx",
    )
    nodes = [
        mk("MatMul", ["x", "w"], ["h"], name="proj"),
        mk("Mul", ["h", "gain"], ["big"], name="widen"),
        mk("Softplus", ["big"], ["y"], name="softplus"),
    ]
    inits = [weight("w", [8, 5]), floats(40.0, "gain")]
    save(model(nodes, [tensor("x", [3, 8])], [tensor("y", [3, 5])], inits), "softplus.onnx")
    nodes = [
        mk("Flatten", ["x"], ["f"], name="flatten_last", axis=-1),
        mk("MatMul", ["f", "w"], ["y"], name="proj"),
    ]
    save(model(nodes, [tensor("x", [2, 3, 4, 5])], [tensor("y", [24, 3])], [weight("w", [5, 3])]), "flatten_negative.onnx")
    nodes = [
        mk("MatMul", ["x", "w"], ["h"], name="proj"),
        mk("ReduceSum", ["h"], ["y"], name="noop_sum", noop_with_empty_axes=1),
    ]
    save(model(nodes, [tensor("x", [3, 4])], [tensor("y", [3, 2])], [weight("w", [4, 2])]), "reduce_noop.onnx")
    # Instance norm with constant scale and bias: memc's groupnorm with a group per channel.
    nodes = [mk("InstanceNormalization", ["x", "s", "b"], ["y"], name="inorm", epsilon=1e-3)]
    save(model(nodes, [tensor("x", [2, 3, 5, 4])], [tensor("y", [2, 3, 5, 4])], [weight("s", [3]), weight("b", [3])]), "instance_norm.onnx")
    # Einsum in the usual transformer patterns: attention scores and their product with the
    # values, a transpose, a matmul, a batched inner product, a sum and a full contraction.
    nodes = [
        mk("Einsum", ["q", "k"], ["scores"], name="scores", equation="bhqd,bhkd->bhqk"),
        mk("Einsum", ["scores", "k"], ["context"], name="context", equation="bhqk,bhkd->bhqd"),
        mk("Einsum", ["q"], ["swapped"], name="swap", equation="bhqd->bdhq"),
        mk("Einsum", ["m", "w"], ["mm"], name="mm", equation="ij,jk"),
        mk("Einsum", ["m", "m"], ["dots"], name="dots", equation="ij,ij->i"),
        mk("Einsum", ["m"], ["colsum"], name="colsum", equation="ij->j"),
        mk("Einsum", ["m", "m"], ["total"], name="total", equation="ij,ij->"),
    ]
    outs = [
        tensor("scores", [2, 3, 4, 5]),
        tensor("context", [2, 3, 4, 6]),
        tensor("swapped", [2, 6, 3, 4]),
        tensor("mm", [4, 2]),
        tensor("dots", [4]),
        tensor("colsum", [3]),
        tensor("total", []),
    ]
    ins = [tensor("q", [2, 3, 4, 6]), tensor("k", [2, 3, 5, 6]), tensor("m", [4, 3])]
    save(model(nodes, ins, outs, [weight("w", [3, 2])], opset=12), "einsum.onnx")
    nodes = [mk("Einsum", ["x"], ["y"], name="diagonal", equation="ii->i")]
    save(model(nodes, [tensor("x", [3, 3])], [tensor("y", [3])], opset=12), "errors/einsum_diagonal.onnx")
    # Caffe2-style names sharing a `gpu_0/` prefix: memc names the input `data_0`.
    nodes = [mk("MatMul", ["gpu_0/data_0", "gpu_0/w"], ["gpu_0/y"], name="gpu_0/proj")]
    save(model(nodes, [tensor("gpu_0/data_0", [2, 4])], [tensor("gpu_0/y", [2, 3])], [weight("gpu_0/w", [4, 3])]), "prefixed_names.onnx")
    ints = TensorProto.INT32
    save(model([mk("Identity", ["x"], ["y"], name="same")], [tensor("x", [2, 3], ints)], [tensor("y", [2, 3], ints)]), "errors/integer_output.onnx")
    save(model([mk("Cast", ["x"], ["y"], name="widen", to=1)], [tensor("x", [2, 3], ints)], [tensor("y", [2, 3])]), "errors/cast_integer_input.onnx")
    save(model([mk("Relu", ["x"], ["y"], name="act")], [tensor("x", [0, 3])], [tensor("y", [0, 3])]), "errors/zero_dim.onnx")
    nodes = [
        mk("MatMul", ["x", "w"], ["h"], name="proj"),
        mk("Sigmoid", ["h"], ["p"], name="positive"),
        mk("ReduceMin", ["h"], ["min"], axes=[1], keepdims=0),
        mk("ReduceSumSquare", ["h"], ["sum_square"], axes=[1], keepdims=1),
        mk("ReduceL1", ["h"], ["l1"], axes=[0], keepdims=0),
        mk("ReduceL2", ["h"], ["l2"], axes=[1], keepdims=0),
        mk("ReduceLogSumExp", ["h"], ["log_sum_exp"], axes=[1], keepdims=0),
        mk("ReduceLogSum", ["p"], ["log_sum"], axes=[1], keepdims=0),
    ]
    outs = [tensor("min", [3]), tensor("sum_square", [3, 1]), tensor("l1", [5]), tensor("l2", [3]), tensor("log_sum_exp", [3]), tensor("log_sum", [3])]
    save(model(nodes, [tensor("x", [3, 4])], outs, [weight("w", [4, 5])]), "reduce_family.onnx")
    select_shapes()
    interpolate()


def select_shapes():
    mk = helper.make_node
    i64 = lambda v, name: numpy_helper.from_array(np.array(v, dtype=np.int64), name)
    f32 = lambda v, name: numpy_helper.from_array(np.array(v, dtype=np.float32), name)
    nodes = [
        mk("MatMul", ["x", "w"], ["h"], name="proj"),
        mk("Shape", ["h"], ["shape"], name="shape"),
        mk("Gather", ["shape", "zero"], ["batch"], name="batch", axis=0),
        mk("Unsqueeze", ["batch", "axis0"], ["batch1"], name="batch1"),
        mk("Concat", ["batch1", "heads_tail"], ["target"], name="target", axis=0),
        mk("Reshape", ["h", "target"], ["split"], name="split_heads"),
        mk("Transpose", ["split"], ["q"], name="heads_first", perm=[0, 2, 1, 3]),
        mk("Transpose", ["q"], ["kt"], name="kt", perm=[0, 1, 3, 2]),
        mk("MatMul", ["q", "kt"], ["scores"], name="scores"),
        mk("Range", ["zero", "five", "one"], ["steps"], name="steps"),
        mk("Unsqueeze", ["steps", "axis0"], ["row"], name="row"),
        mk("Unsqueeze", ["steps", "axis1"], ["col"], name="col"),
        mk("Less", ["col", "row"], ["future"], name="future"),
        mk("Where", ["future", "minus_big", "scores"], ["masked"], name="causal"),
        mk("Greater", ["masked", "threshold"], ["high"], name="high"),
        mk("Mul", ["masked", "half"], ["damped"], name="damp"),
        mk("Where", ["high", "damped", "masked"], ["tamed"], name="tame"),
        mk("Softmax", ["tamed"], ["p"], name="softmax", axis=-1),
        mk("Clip", ["scores", "lo", "hi"], ["clipped"], name="clip"),
        mk("Clip", ["clipped", "", "hi2"], ["clipped2"], name="clip_upper"),
        mk("Slice", ["h", "starts", "ends", "axes"], ["mid"], name="mid"),
        mk("Sigmoid", ["mid"], ["sig"], name="sig"),
        mk("Min", ["mid", "sig"], ["low"], name="low"),
        mk("Max", ["mid", "low", "sig"], ["top"], name="top"),
        mk("Add", ["sig", "one_f"], ["sig1"], name="sig1"),
        mk("Reciprocal", ["sig1"], ["inv"], name="inv"),
        mk("CastLike", ["two", "x"], ["two_f"], name="two_like"),
        mk("Mul", ["inv", "two_f"], ["inv2"], name="inv2"),
        mk("Cast", ["high"], ["high_f"], name="high_f", to=1),
        mk("ReduceSum", ["high_f", "last"], ["high_n"], name="high_n", keepdims=0),
        mk("Add", ["top", "inv2"], ["body"], name="body"),
        mk("Concat", ["batch1", "one_eight"], ["cls_shape"], name="cls_shape", axis=0),
        mk("Expand", ["cls", "cls_shape"], ["cls_b"], name="cls_b"),
        mk("Concat", ["cls_b", "body"], ["tokens"], name="tokens", axis=1),
    ]
    inits = [
        weight("w", [8, 8]),
        weight("cls", [1, 1, 8]),
        i64(0, "zero"),
        i64(5, "five"),
        i64(1, "one"),
        i64([0], "axis0"),
        i64([1], "axis1"),
        i64([-1], "last"),
        i64([5, 2, 4], "heads_tail"),
        i64([1], "starts"),
        i64([4], "ends"),
        i64([1], "axes"),
        i64([1, 8], "one_eight"),
        f32(-1e4, "minus_big"),
        f32(0.3, "threshold"),
        f32(0.5, "half"),
        f32(-0.5, "lo"),
        f32(0.6, "hi"),
        f32(0.4, "hi2"),
        f32(1.0, "one_f"),
        f32(2.0, "two"),
    ]
    outs = [tensor("p", [2, 2, 5, 5]), tensor("clipped2", [2, 2, 5, 5]), tensor("tokens", [2, 4, 8]), tensor("high_n", [2, 2, 5])]
    save(model(nodes, [tensor("x", [2, 5, 8])], outs, inits, opset=17), "select_shapes.onnx")
    less = mk("Less", ["x", "y"], ["z"], name="less")
    save(model([less], [tensor("x", [2, 3]), tensor("y", [2, 3])], [tensor("z", [2, 3], TensorProto.BOOL)]), "bool_output.onnx")
    act = mk("Relu", ["x"], ["z"], name="act")
    save(model([act], [tensor("x", [2, 3])], [tensor("z", [2, 3], TensorProto.BOOL)]), "errors/bool_output.onnx")
    nodes = [mk("Relu", ["x"], ["r"], name="act"), mk("Slice", ["r", "starts", "ends", "axes", "steps"], ["y"], name="every_other")]
    inits = [i64([0], "starts"), i64([6], "ends"), i64([1], "axes"), i64([2], "steps")]
    save(model(nodes, [tensor("x", [2, 6])], [tensor("y", [2, 3])], inits), "errors/slice_step.onnx")
    sce = mk("SoftmaxCrossEntropyLoss", ["x", "t"], ["loss"], name="ce", ignore_index=-1)
    targets = tensor("t", [3], TensorProto.INT64)
    save(model([sce], [tensor("x", [3, 5]), targets], [tensor("loss", [])]), "errors/loss_negative_ignore.onnx")


def interpolate():
    """tests/onnx/interpolate.onnx: Resize linear by fractional scales, cubic to sizes with
    align_corners, antialiased cubic downsampling, nearest (round_prefer_ceil, asymmetric) by
    fractional scales; Pow with a computed exponent; ConvTranspose of a computed weight to an
    `output_shape` (opset 19)."""
    mk = helper.make_node
    f32 = lambda v, name: numpy_helper.from_array(np.array(v, dtype=np.float32), name)
    i64 = lambda v, name: numpy_helper.from_array(np.array(v, dtype=np.int64), name)
    nodes = [
        mk("Resize", ["x", "", "s_linear"], ["linear"], name="linear", mode="linear"),
        mk("Resize", ["x", "", "", "n_cubic"], ["cubic"], name="cubic", mode="cubic",
           coordinate_transformation_mode="align_corners"),
        mk("Resize", ["x", "", "s_shrink"], ["antialias"], name="antialias", mode="cubic", antialias=1),
        mk("Resize", ["x", "", "s_nearest"], ["nearest"], name="nearest", mode="nearest",
           nearest_mode="round_prefer_ceil", coordinate_transformation_mode="asymmetric"),
        mk("Sigmoid", ["x"], ["base"], name="base"),
        mk("Pow", ["base", "x"], ["power"], name="power"),
        mk("ConvTranspose", ["x", "w"], ["deconv"], name="deconv", strides=[2, 2], output_shape=[10, 12]),
    ]
    inits = [
        f32([1, 1, 1.5, 0.75], "s_linear"),
        i64([1, 2, 9, 11], "n_cubic"),
        f32([1, 1, 0.6, 0.5], "s_shrink"),
        f32([1, 1, 1.6, 2.5], "s_nearest"),
    ]
    outs = [
        tensor("linear", [1, 2, 7, 4]),
        tensor("cubic", [1, 2, 9, 11]),
        tensor("antialias", [1, 2, 3, 3]),
        tensor("nearest", [1, 2, 8, 15]),
        tensor("power", [1, 2, 5, 6]),
        tensor("deconv", [1, 3, 10, 12]),
    ]
    ins = [tensor("x", [1, 2, 5, 6]), tensor("w", [2, 3, 3, 3])]
    save(model(nodes, ins, outs, inits, opset=19), "interpolate.onnx")


if __name__ == "__main__":
    main()
