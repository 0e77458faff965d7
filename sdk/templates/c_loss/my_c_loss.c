/* A loss plugin written in plain C11 against the plugin ABI (rl_plugin.h) only.
 * loss = -sum(advantages * logprobs) / n; d loss / d logprobs = -advantages / n. */
#include <rl_plugin.h>

#include <stdlib.h>
#include <string.h>

static const rl_host_api_t *g_host;

static double at(const rl_tensor_view_t *v, int64_t i) {
    const char *base = (const char *)v->data + v->byte_offset;
    int64_t stride = v->strides ? v->strides[0] : 1;
    if (v->dtype.bits == 64) return ((const double *)(const void *)base)[i * stride];
    return ((const float *)(const void *)base)[i * stride];
}

static const rl_tensor_view_t *find(const rl_tensor_list_t *l, const char *name) {
    uint64_t i;
    for (i = 0; i < l->count; ++i)
        if (strcmp(l->items[i].name, name) == 0) return &l->items[i].view;
    return NULL;
}

static const char *const k_required[] = {"logprobs", "advantages", NULL};
static const char *const k_optional[] = {NULL};
static const char *const k_diff[] = {"logprobs", NULL};

static rl_status_t RL_ABI get_signature(const rl_plugin_t *plugin, rl_loss_signature_t *out) {
    (void)plugin;
    out->required = k_required;
    out->optional = k_optional;
    out->differentiable = k_diff;
    return RL_OK;
}

static rl_status_t RL_ABI compute(const rl_plugin_t *plugin, const rl_call_ctx_t *ctx,
                                  const rl_loss_inputs_t *in, rl_loss_outputs_t *out) {
    const rl_tensor_view_t *lp = find(&in->tensors, "logprobs");
    const rl_tensor_view_t *adv = find(&in->tensors, "advantages");
    const rl_tensor_view_t *grad = out->grads.count ? &out->grads.items[0].view : NULL;
    int64_t n, i;
    double sum = 0;
    (void)plugin;
    if (!lp || !adv)
        return ctx->host->fail(ctx, RL_ERR_INVALID_ARG, "logprobs and advantages are required");
    n = lp->shape[0];
    if (n == 0) return ctx->host->fail(ctx, RL_ERR_INVALID_ARG, "empty batch");
    for (i = 0; i < n; ++i) sum += at(adv, i) * at(lp, i);
    if (grad) {
        for (i = 0; i < n; ++i) {
            double g = -at(adv, i) / (double)n;
            if (grad->dtype.bits == 64)
                ((double *)grad->data)[i] = g;
            else
                ((float *)grad->data)[i] = (float)g;
        }
    }
    out->loss = -sum / (double)n;
    return ctx->host->emit_metric(ctx, "n_tokens", (double)n);
}

static const rl_loss_iface_t k_loss = {sizeof(rl_loss_iface_t), 0, get_signature, compute};

static void RL_ABI destroy(const rl_plugin_t *plugin) {
    free((void *)plugin);
}

static const void *RL_ABI get_interface(const rl_plugin_t *plugin, const char *id) {
    (void)plugin;
    return strcmp(id, RL_IFACE_LOSS) == 0 ? &k_loss : NULL;
}

static const rl_plugin_desc_t k_desc = {sizeof(rl_plugin_desc_t),
                                        RL_ABI_VERSION,
                                        "org.example.loss.my_c_loss",
                                        RL_KIND_LOSS,
                                        "my_c_loss",
                                        "0.1.0",
                                        "policy gradient in plain C",
                                        NULL};

static uint32_t RL_ABI count(const rl_plugin_factory_t *f) {
    (void)f;
    return 1;
}
static const rl_plugin_desc_t *RL_ABI get_desc(const rl_plugin_factory_t *f, uint32_t i) {
    (void)f;
    return i == 0 ? &k_desc : NULL;
}
static rl_status_t RL_ABI create(const rl_plugin_factory_t *f, const rl_call_ctx_t *ctx,
                                 const char *id, const rl_plugin_create_desc_t *desc,
                                 const rl_plugin_t **out) {
    rl_plugin_t *p;
    (void)f;
    (void)desc;
    if (strcmp(id, k_desc.id) != 0) return ctx->host->fail(ctx, RL_ERR_NOT_FOUND, "unknown id");
    p = (rl_plugin_t *)calloc(1, sizeof(*p));
    if (!p) return RL_ERR_OUT_OF_MEMORY;
    p->struct_size = sizeof(*p);
    p->desc = &k_desc;
    p->destroy = destroy;
    p->get_interface = get_interface;
    *out = p;
    return RL_OK;
}
static const rl_plugin_factory_t k_factory = {sizeof(rl_plugin_factory_t), 0, count, get_desc,
                                              create};

static rl_status_t RL_ABI init(const rl_host_api_t *host, const char *path) {
    (void)path;
    if (!RL_ABI_COMPATIBLE(host->abi_version, RL_ABI_VERSION)) return RL_ERR_INCOMPATIBLE;
    g_host = host;
    return RL_OK;
}
static void RL_ABI deinit(void) {
    g_host = NULL;
}
static const void *RL_ABI get_factory(const char *id) {
    return strcmp(id, RL_FACTORY_PLUGIN) == 0 ? &k_factory : NULL;
}

static const rl_plugin_entry_t k_entry = {sizeof(rl_plugin_entry_t), RL_ABI_VERSION, init, deinit,
                                          get_factory};

RL_EXPORT const rl_plugin_entry_t *RL_ABI rl_plugin_entry(void);
RL_EXPORT const rl_plugin_entry_t *RL_ABI rl_plugin_entry(void) {
    return &k_entry;
}
