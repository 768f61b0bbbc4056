-- Wireshark dissector for innet's gradient aggregation header (innet.wire.layer.InnetAgg).
--
-- Frames are Ethernet / IPv4 / UDP port 48879 / innet header (16 bytes, network byte order) / payload.
-- Field names follow the header table in innet's README: innet.job, innet.rank, ... innet.exp.
-- The payload is `count` little-endian int32 values: the gradient (innet.value), or with SPARSE
-- [dense_count, index, value, index, value, ...], or with ABORT [node, missing rank, ...].
--
-- Install: python3 -m innet.wire.dissector --install
-- Or once: tshark -X lua_script:innet.lua -r s1-eth0.pcap

local loaded, earlier = pcall(Dissector.get, "innet")
if loaded and earlier then return end  -- already loaded: installed, and given with -X lua_script too

local AGG_PORT = 48879
local HEADER_LEN = 16
local ALL_RANKS = 0xFFFF
local INPUT_JOB = 0xFFFF
local FLAGS = {  -- bit order of innet.wire.packet.FLAG_NAMES
    {"RESULT", 0x01}, {"RETX", 0x02}, {"ROUTE", 0x04}, {"OVERFLOW", 0x08},
    {"VER", 0x10}, {"SPARSE", 0x20}, {"FALLBACK", 0x40}, {"ABORT", 0x80},
}

local innet = Proto("innet", "innet gradient aggregation")
local f = innet.fields
f.job = ProtoField.uint16("innet.job", "job", base.DEC)
f.rank = ProtoField.uint16("innet.rank", "rank", base.DEC)
f.nworkers = ProtoField.uint16("innet.nworkers", "nworkers", base.DEC)
f.slot = ProtoField.uint16("innet.slot", "slot", base.DEC)
f.chunk = ProtoField.uint32("innet.chunk", "chunk", base.DEC)
f.count = ProtoField.uint16("innet.count", "count", base.DEC)
f.flags = ProtoField.uint8("innet.flags", "flags", base.HEX)
for _, flag in ipairs(FLAGS) do
    f["flag_" .. flag[1]] = ProtoField.bool("innet.flags." .. flag[1]:lower(), flag[1], 8, nil, flag[2])
end
f.exp = ProtoField.int8("innet.exp", "exp", base.DEC)
f.kind = ProtoField.string("innet.kind", "kind")
f.value = ProtoField.int32("innet.value", "value", base.DEC)
f.dense_count = ProtoField.int32("innet.dense_count", "dense_count", base.DEC)
f.index = ProtoField.int32("innet.index", "index", base.DEC)
f.abort_node = ProtoField.int32("innet.abort_node", "abort_node", base.DEC)
f.missing_rank = ProtoField.int32("innet.missing_rank", "missing_rank", base.DEC)

local short = ProtoExpert.new("innet.short", "frame shorter than count values", expert.group.MALFORMED, expert.severity.ERROR)
local odd = ProtoExpert.new("innet.sparse_odd", "SPARSE payload is not dense_count plus (index, value) pairs",
                            expert.group.MALFORMED, expert.severity.WARN)
innet.experts = {short, odd}

local function has(flags, mask)
    return math.floor(flags / mask) % 2 == 1
end

-- As innet.switch.runtime.kind_of: which handler of a switch program the packet goes to.
local function kind_of(flags)
    if has(flags, 0x04) then return "routed" end
    if has(flags, 0x80) then return "abort" end
    if has(flags, 0x01) then return "result" end
    return "contribution"
end

local function int_at(buf, n)
    return buf(HEADER_LEN + 4 * n, 4)
end

local function payload(buf, tree, flags, count)
    if has(flags, 0x20) then  -- SPARSE
        tree:add_le(f.dense_count, int_at(buf, 0))
        for i = 1, count - 2, 2 do
            local pair = tree:add(buf(HEADER_LEN + 4 * i, 8), string.format("[%d] = %d",
                                  int_at(buf, i):le_int(), int_at(buf, i + 1):le_int()))
            pair:add_le(f.index, int_at(buf, i))
            pair:add_le(f.value, int_at(buf, i + 1))
        end
        if count % 2 == 0 then tree:add_proto_expert_info(odd) end
    elseif has(flags, 0x80) and count > 0 then  -- ABORT: who gave up, and whom it waited for
        tree:add_le(f.abort_node, int_at(buf, 0))
        for i = 1, count - 1 do tree:add_le(f.missing_rank, int_at(buf, i)) end
    else
        for i = 0, count - 1 do
            tree:add_le(f.value, int_at(buf, i)):prepend_text(string.format("[%d] ", i))
        end
    end
end

function innet.dissector(buf, pinfo, tree)
    if buf:len() < HEADER_LEN then return 0 end
    pinfo.cols.protocol = "innet"
    local count, flags = buf(12, 2):uint(), buf(14, 1):uint()
    local t = tree:add(innet, buf(0, math.min(buf:len(), HEADER_LEN + 4 * count)))
    local job, rank = buf(0, 2):uint(), buf(2, 2):uint()
    local jt = t:add(f.job, buf(0, 2))
    if job == INPUT_JOB then jt:append_text(" (ensemble input)") end
    local rt = t:add(f.rank, buf(2, 2))
    if rank == ALL_RANKS then rt:append_text(" (all)") end
    t:add(f.nworkers, buf(4, 2))
    t:add(f.slot, buf(6, 2))
    t:add(f.chunk, buf(8, 4))
    t:add(f.count, buf(12, 2))
    local ft = t:add(f.flags, buf(14, 1))
    local names = {}
    for _, flag in ipairs(FLAGS) do
        ft:add(f["flag_" .. flag[1]], buf(14, 1))
        if has(flags, flag[2]) then names[#names + 1] = flag[1] end
    end
    if #names > 0 then ft:append_text(" (" .. table.concat(names, ", ") .. ")") end
    t:add(f.exp, buf(15, 1))
    local kind = kind_of(flags)
    t:add(f.kind, kind):set_generated()

    pinfo.cols.info:set(string.format("%s job %d rank %s slot %d chunk %d count %d%s", kind, job,
                        rank == ALL_RANKS and "all" or tostring(rank), buf(6, 2):uint(), buf(8, 4):uint(), count,
                        #names > 0 and " [" .. table.concat(names, ",") .. "]" or ""))
    if buf:len() < HEADER_LEN + 4 * count then
        t:add_proto_expert_info(short)
        count = math.floor((buf:len() - HEADER_LEN) / 4)
    end
    payload(buf, t, flags, count)
    return buf:len()
end

DissectorTable.get("udp.port"):add(AGG_PORT, innet)
