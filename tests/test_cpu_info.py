"""``sapiens2.benchmark``'s CPU description: ISA features and the peak behind the MFU, from real /proc/cpuinfo text.

The snippets are copied from real machines: an AWS m7a (AMD EPYC 9R14, Zen 4), a Google Cloud c3 (Intel Xeon
Platinum 8481C, Sapphire Rapids: its /proc/cpuinfo header, with the flags its ``lscpu`` printed) and the 2-core
Xeon VM this package's CPU benchmarks ran on (Cascade Lake: AVX-512 VNNI, no BF16, no AMX).
"""

from __future__ import annotations

import pytest
import torch

from sapiens2.benchmark import cpu_info, parse_cpuinfo

ZEN4 = """\
processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9R14
stepping\t: 1
microcode\t: 0xa101148
cpu MHz\t\t: 3698.291
cache size\t: 1024 KB
physical id\t: 0
siblings\t: 32
core id\t\t: 0
cpu cores\t: 32
apicid\t\t: 0
initial apicid\t: 0
fpu\t\t: yes
fpu_exception\t: yes
cpuid level\t: 16
wp\t\t: yes
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht \
syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl nonstop_tsc cpuid extd_apicid aperfmperf \
tsc_known_freq pni pclmulqdq monitor ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand \
hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch topoext perfctr_core invpcid_single ssbd \
perfmon_v2 ibrs ibpb stibp ibrs_enhanced vmmcall fsgsbase bmi1 avx2 smep bmi2 invpcid avx512f avx512dq rdseed adx \
smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx512_bf16 clzero \
xsaveerptr rdpru wbnoinvd arat avx512vbmi pku ospke avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg \
avx512_vpopcntdq rdpid flush_l1d
bugs\t\t: sysret_ss_attrs spectre_v1 spectre_v2 spec_store_bypass srso
bogomips\t: 5200.00
TLB size\t: 3584 4K pages
clflush size\t: 64
cache_alignment\t: 64
address sizes\t: 48 bits physical, 48 bits virtual
power management:
"""

SAPPHIRE_RAPIDS = """\
vendor_id       : GenuineIntel
cpu family      : 6
model           : 143
model name      : Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
stepping        : 8
microcode       : 0xffffffff
cpu MHz         : 2699.998
cache size      : 107520 KB
flags           : fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 \
ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid tsc_known_freq pni \
pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm abm \
3dnowprefetch ssbd ibrs ibpb stibp ibrs_enhanced fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid rtm avx512f \
avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves \
avx_vnni avx512_bf16 arat avx512vbmi umip avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg \
avx512_vpopcntdq la57 rdpid cldemote movdiri movdir64b fsrm md_clear serialize tsxldtrk amx_bf16 avx512_fp16 \
amx_tile amx_int8 arch_capabilities
"""

_XEON_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht syscall "
    "nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid tsc_known_freq pni pclmulqdq ssse3 "
    "fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm "
    "abm 3dnowprefetch cpuid_fault ssbd ibrs ibpb stibp ibrs_enhanced fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms "
    "invpcid mpx avx512f avx512dq rdseed adx smap clflushopt clwb avx512cd avx512bw avx512vl xsaveopt xsavec xgetbv1 "
    "xsaves arat umip pku ospke avx512_vnni md_clear flush_l1d arch_capabilities"
)
CASCADE_LAKE = "\n".join(
    f"processor\t: {core}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n"
    f"model name\t: Intel(R) Xeon(R) Processor @ 2.50GHz\nstepping\t: 7\nmicrocode\t: 0x1\ncpu MHz\t\t: 2500.016\n"
    f"cache size\t: 36608 KB\nphysical id\t: 0\nsiblings\t: 2\ncore id\t\t: {core}\ncpu cores\t: 2\n"
    f"apicid\t\t: {core}\ninitial apicid\t: {core}\nfpu\t\t: yes\nfpu_exception\t: yes\ncpuid level\t: 22\n"
    f"wp\t\t: yes\nflags\t\t: {_XEON_FLAGS}\nbogomips\t: 5000.03\nclflush size\t: 64\n"
    "cache_alignment\t: 64\naddress sizes\t: 46 bits physical, 48 bits virtual\npower management:\n"
    for core in (0, 1)
)


def test_zen4_runs_avx512_at_half_width_and_has_no_amx():
    info = parse_cpuinfo(ZEN4, "AVX512")
    assert info.model == "AMD EPYC 9R14" and info.vendor == "AuthenticAMD" and info.family == 25
    assert info.features == ["AVX2", "FMA", "AVX-512", "AVX-512 VNNI", "AVX-512 BF16"]
    assert info.ghz == pytest.approx(3.698291)  # no clock in the name: the cpu MHz reading
    assert (info.logical, info.cores) == (1, 1)  # one processor block listed
    assert [info.flops_per_cycle(d) for d in ("fp32", "bf16", "fp16", "int8")] == [32, 64, 32, 128]
    assert info.peak_tflops("bf16", 2) == pytest.approx(64 * 2 * 3.698291 / 1000)


def test_sapphire_rapids_has_amx_for_bf16_and_int8():
    info = parse_cpuinfo(SAPPHIRE_RAPIDS)
    assert info.model == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz" and info.family == 6
    assert info.features == ["AVX2", "FMA", "AVX-512", "AVX-512 VNNI", "AVX-512 BF16", "AVX-512 FP16", "AVX-VNNI",
                             "AMX-BF16", "AMX-INT8"]  # fmt: skip
    assert info.ghz == 2.7  # the nominal clock in the name wins over the momentary cpu MHz
    assert [info.flops_per_cycle(d) for d in ("fp32", "bf16", "fp16", "int8")] == [64, 1024, 128, 2048]
    assert info.peak_tflops("bf16", 2) == pytest.approx(1024 * 2 * 2.7 / 1000)  # 5.53 TFLOP/s on two cores


def test_this_xeon_has_avx512_vnni_but_no_bf16_hardware():
    info = parse_cpuinfo(CASCADE_LAKE, "AVX512")
    assert info.model == "Intel(R) Xeon(R) Processor @ 2.50GHz"
    assert info.features == ["AVX2", "FMA", "AVX-512", "AVX-512 VNNI"]
    assert (info.logical, info.cores, info.threads_per_core()) == (2, 2, 1)
    assert [info.flops_per_cycle(d) for d in ("fp32", "bf16", "fp16", "int8")] == [64, 64, 64, 256]
    assert info.peak_tflops("fp32", 2) == pytest.approx(0.32)


def test_hyperthreads_are_not_cores_and_no_clock_means_no_peak():
    text = "\n\n".join(
        f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: Some CPU\nphysical id\t: 0\n"
        f"core id\t\t: {i // 2}\ncpu cores\t: 2\nflags\t\t: avx avx2 fma"
        for i in range(4)
    )
    info = parse_cpuinfo(text)
    assert (info.logical, info.cores, info.threads_per_core()) == (4, 2, 2)
    assert info.ghz is None and info.peak_tflops("fp32", 2) is None and info.flops_per_cycle("fp32") == 32
    with pytest.raises(ValueError, match="dtype must be"):
        info.flops_per_cycle("fp64")


def test_this_machine_is_described_with_torchs_kernel_choice():
    info = cpu_info()
    assert info.capability == torch.backends.cpu.get_cpu_capability()
    assert info.logical >= 1 and info.model
