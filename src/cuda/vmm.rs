//! CUDA virtual memory management: reserve an address range once, back it with physical memory
//! page by page (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`), and unmap any page again.
//!
//! Three RAII types hold the driver objects: an [`AddressReservation`] (freed with
//! `cuMemAddressFree`), a [`PhysicalMemory`] handle (released with `cuMemRelease`) and a
//! [`Mapping`] of one handle at one address (unmapped with `cuMemUnmap`). [`VirtualRange`] puts
//! them together with a safe interface: one reservation, one physical handle per mapped page, so
//! that any page can be unmapped on its own (CUDA unmaps only whole mappings).
//!
//! Every call expects the context of the range's device to be current
//! ([`ContextGuard`](super::ContextGuard)).

use super::check::{check, check_alloc};

use super::driver::{device_handle, ensure_driver};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::collections::BTreeMap;

/// Allocation properties of pinned device memory on `device`.
fn device_props(device: sys::CUdevice) -> sys::CUmemAllocationProp {
    // SAFETY: all-zero is a valid value of this plain C struct (no handle types, no flags).
    let mut props: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    props.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = device;
    props
}

/// Allocation properties of pinned device memory on `device` that can be exported as a POSIX
/// file descriptor (`cuMemExportToShareableHandle`) for another process to import.
fn shareable_props(device: sys::CUdevice) -> sys::CUmemAllocationProp {
    let mut props = device_props(device);
    props.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    props
}

/// Allocation properties of pinned host memory on the host NUMA node closest to `ordinal`
/// (node 0 where the driver names none): host pages mapped into a device's address range and
/// read in place over the link.
fn host_props(ordinal: usize) -> sys::CUmemAllocationProp {
    // SAFETY: all-zero is a valid value of this plain C struct (no handle types, no flags).
    let mut props: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    props.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA;
    props.location.id = super::host_numa_node(ordinal)
        .and_then(|n| i32::try_from(n).ok())
        .unwrap_or(0);
    props
}

/// `cuMemGetAllocationGranularity` (minimum): the unit in which device `ordinal`'s physical
/// memory is created and mapped (2 MiB on current GPUs).
///
/// # Errors
/// No driver, a bad ordinal, or the CUDA error (devices without virtual memory management).
pub fn allocation_granularity(ordinal: usize) -> Result<usize> {
    let props = device_props(device_handle(ordinal)?);
    let mut granularity = 0usize;
    // SAFETY: `granularity` is a valid out-pointer and `props` a fully initialised struct.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut granularity,
            &props,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    Ok(granularity.max(1))
}

/// A reserved virtual address range with no memory behind it (`cuMemAddressReserve`); freed on
/// drop.
#[derive(Debug)]
pub struct AddressReservation {
    base: usize,
    size: usize,
}

impl AddressReservation {
    /// Reserves `size` bytes of addresses aligned to `alignment` (both multiples of the
    /// allocation granularity).
    ///
    /// # Errors
    /// No driver, or the CUDA error (out of memory when the address space is exhausted).
    pub fn new(size: usize, alignment: usize) -> Result<Self> {
        ensure_driver()?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: `base` is a valid out-pointer; a zero hint address and zero flags are valid.
        let result = unsafe { sys::cuMemAddressReserve(&mut base, size, alignment, 0, 0) };
        check_alloc("cuMemAddressReserve", result, size)?;
        Ok(AddressReservation {
            base: base as usize,
            size,
        })
    }

    /// The first address.
    pub fn base(&self) -> usize {
        self.base
    }

    /// The length in bytes.
    pub fn size(&self) -> usize {
        self.size
    }
}

impl Drop for AddressReservation {
    fn drop(&mut self) {
        // SAFETY: the range came from cuMemAddressReserve with this size and is freed once; the
        // owner unmapped every page before (VirtualRange clears its mappings first).
        unsafe {
            sys::cuMemAddressFree(self.base as sys::CUdeviceptr, self.size);
        }
    }
}

/// A handle to physical device memory (`cuMemCreate`); released on drop (the memory itself goes
/// back to the device once no mapping uses it).
#[derive(Debug)]
pub struct PhysicalMemory {
    handle: sys::CUmemGenericAllocationHandle,
    size: usize,
    on_host: bool,
}

impl PhysicalMemory {
    /// Creates `size` bytes (a multiple of the granularity) of physical memory on device
    /// `ordinal`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the device has no memory left; other CUDA errors.
    pub fn new(ordinal: usize, size: usize) -> Result<Self> {
        let device = device_handle(ordinal)?;
        Self::create(size, &device_props(device), false, "cuMemCreate")
    }

    /// Creates `size` bytes (a multiple of the device's granularity) of pinned host memory on
    /// the host NUMA node closest to device `ordinal`, to be mapped into the device's address
    /// range (read in place over the link).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the host has no memory left; other CUDA errors (drivers
    /// without host NUMA allocations).
    pub fn new_on_host(ordinal: usize, size: usize) -> Result<Self> {
        device_handle(ordinal)?;
        Self::create(size, &host_props(ordinal), true, "cuMemCreate(host NUMA)")
    }

    /// Creates `size` bytes (a multiple of the granularity) of physical memory on device
    /// `ordinal` that can be exported as a POSIX file descriptor ([`export_fd`](Self::export_fd)).
    ///
    /// # Errors
    /// As [`new`](Self::new); drivers that cannot share memory refuse the handle type.
    pub fn new_shareable(ordinal: usize, size: usize) -> Result<Self> {
        let device = device_handle(ordinal)?;
        Self::create(
            size,
            &shareable_props(device),
            false,
            "cuMemCreate(shareable)",
        )
    }

    /// Exports the memory as a POSIX file descriptor another process imports
    /// (`cuMemExportToShareableHandle`); the memory must have been made by
    /// [`new_shareable`](Self::new_shareable).
    ///
    /// # Errors
    /// The CUDA error (memory made without the handle type).
    pub fn export_fd(&self) -> Result<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: for a POSIX file descriptor the shareable handle is an int, which `fd` is
        // and outlives the call; the handle came from cuMemCreate and is live.
        check("cuMemExportToShareableHandle", unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast(),
                self.handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        if fd < 0 {
            return Err(Error::Logic(
                "cuMemExportToShareableHandle returned no descriptor".into(),
            ));
        }
        // SAFETY: the driver made this descriptor for the caller, who owns it from here.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    /// Imports memory another process exported as a POSIX file descriptor
    /// (`cuMemImportFromShareableHandle`), `size` bytes as its exporter says (the map fails
    /// where they are not the memory's).
    ///
    /// # Errors
    /// No driver, or the CUDA error (a descriptor that is not such memory).
    pub fn import_fd(fd: std::os::fd::BorrowedFd<'_>, size: usize) -> Result<Self> {
        use std::os::fd::AsRawFd;
        ensure_driver()?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid out-pointer; for a POSIX file descriptor the driver
        // takes the descriptor's value in the pointer (it reads nothing through it); `fd` is
        // open across the call (the driver keeps no reference to it).
        check("cuMemImportFromShareableHandle", unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as usize as *mut std::ffi::c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        Ok(PhysicalMemory {
            handle,
            size,
            on_host: false,
        })
    }

    /// `size` bytes of physical memory where `props` places them (`cuMemCreate`, named `call`
    /// in errors).
    fn create(
        size: usize,
        props: &sys::CUmemAllocationProp,
        on_host: bool,
        call: &'static str,
    ) -> Result<Self> {
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid out-pointer, `props` a fully initialised struct; flags
        // must be 0.
        let result = unsafe { sys::cuMemCreate(&mut handle, size, props, 0) };
        check_alloc(call, result, size)?;
        Ok(PhysicalMemory {
            handle,
            size,
            on_host,
        })
    }

    /// Whether the memory lies on the host (made by [`new_on_host`](Self::new_on_host)).
    pub fn on_host(&self) -> bool {
        self.on_host
    }

    /// The size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }
}

impl Drop for PhysicalMemory {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuMemCreate and is released once.
        unsafe {
            sys::cuMemRelease(self.handle);
        }
    }
}

/// Physical memory mapped at an address (access is granted separately, over whole ranges, by
/// [`set_access`]); unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    addr: usize,
    /// `Some` until [`into_memory`](Mapping::into_memory) takes it (drop then unmaps nothing).
    memory: Option<PhysicalMemory>,
    size: usize,
    on_host: bool,
}

impl Mapping {
    /// Maps all of `memory` at `addr` (no access yet: see [`set_access`]).
    ///
    /// # Safety
    /// 1. `addr .. addr + memory.size()` lies inside a live [`AddressReservation`] that outlives
    ///    the returned mapping.
    /// 2. No other mapping covers any of that range.
    ///
    /// # Errors
    /// The CUDA error of the map (nothing is mapped then).
    pub unsafe fn new(addr: usize, memory: PhysicalMemory) -> Result<Self> {
        // SAFETY: the caller's preconditions 1 and 2; offset 0 and flags 0 are the only values.
        check("cuMemMap", unsafe {
            sys::cuMemMap(addr as sys::CUdeviceptr, memory.size, 0, memory.handle, 0)
        })?;
        Ok(Mapping {
            addr,
            size: memory.size,
            on_host: memory.on_host,
            memory: Some(memory),
        })
    }

    /// Unmaps the memory and hands it back, to be mapped elsewhere (or kept); `None` never
    /// happens (the memory is taken only here, which consumes the mapping).
    pub fn into_memory(mut self) -> Option<PhysicalMemory> {
        let memory = self.memory.take()?;
        // SAFETY: this exact range was mapped by `new` and is unmapped once (drop sees `None`).
        unsafe {
            sys::cuMemUnmap(self.addr as sys::CUdeviceptr, self.size);
        }
        Some(memory)
    }

    /// Whether the mapped memory lies on the host.
    pub fn on_host(&self) -> bool {
        self.on_host
    }

    /// Exports the mapped memory as a POSIX file descriptor ([`PhysicalMemory::export_fd`]).
    ///
    /// # Errors
    /// As [`PhysicalMemory::export_fd`].
    pub fn export_fd(&self) -> Result<std::os::fd::OwnedFd> {
        match &self.memory {
            Some(memory) => memory.export_fd(),
            None => Err(Error::Logic("the mapping's memory was taken".into())),
        }
    }

    /// The mapped address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The mapped length.
    pub fn size(&self) -> usize {
        self.size
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.memory.is_some() {
            // SAFETY: this exact range was mapped by `new` and not unmapped by `into_memory`;
            // unmapped once, before the physical handle is released (the field drops after
            // this body).
            unsafe {
                sys::cuMemUnmap(self.addr as sys::CUdeviceptr, self.size);
            }
        }
    }
}

/// `cuMemSetAccess`: makes `addr .. addr + bytes` readable and writable from device `ordinal`
/// (one call over many mappings).
///
/// # Errors
/// A bad ordinal, or the CUDA error (the range must be wholly mapped).
pub fn set_access(ordinal: usize, addr: usize, bytes: usize) -> Result<()> {
    set_access_mode(ordinal, addr, bytes, true)
}

/// `cuMemSetAccess`: makes `addr .. addr + bytes` readable, and writable when `writable`, from
/// device `ordinal`.
///
/// # Errors
/// As [`set_access`].
pub fn set_access_mode(ordinal: usize, addr: usize, bytes: usize, writable: bool) -> Result<()> {
    let access = sys::CUmemAccessDesc {
        location: device_props(device_handle(ordinal)?).location,
        flags: if writable {
            sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        } else {
            sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ
        },
    };
    // SAFETY: `access` is one fully initialised descriptor; the driver checks that the range
    // is mapped and fails otherwise.
    check("cuMemSetAccess", unsafe {
        sys::cuMemSetAccess(addr as sys::CUdeviceptr, bytes, &access, 1)
    })
}

/// One reserved address range of a device, backed page by page: each mapped page has its own
/// physical handle, so any page can be unmapped on its own.
#[derive(Debug)]
pub struct VirtualRange {
    /// Mapped pages by index.
    pages: BTreeMap<usize, Mapping>,
    /// Device pages unmapped while a promotion lends them ([`Self::lend_unmapped`]): out of
    /// `pages` (the range's users count them unmapped) but still mapped at their old address,
    /// where the promotion copies spilled bytes into them before it maps them in place of the
    /// host pages: no device memory made, no second mapping.
    lent: BTreeMap<usize, Mapping>,
    /// Whether [`Self::unmap`] lends device pages to a promotion instead of releasing them.
    lending: bool,
    /// Whether device pages are made with the shareable handle type
    /// ([`PhysicalMemory::new_shareable`]).
    shareable: bool,
    /// Always `Some` until drop, which unmaps every page before freeing the reservation.
    reservation: Option<AddressReservation>,
    base: usize,
    size: usize,
    page_size: usize,
    ordinal: usize,
}

impl VirtualRange {
    /// Reserves `size` bytes of addresses for device `ordinal`, to be mapped in pages of
    /// `page_size` bytes (a multiple of [`allocation_granularity`]; `size` a multiple of it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for sizes that are not multiples of the granularity; the CUDA
    /// error of the reservation.
    pub fn new(ordinal: usize, size: usize, page_size: usize) -> Result<Self> {
        let granularity = allocation_granularity(ordinal)?;
        if page_size == 0 || page_size % granularity != 0 {
            return Err(Error::invalid(
                "page_size",
                format!("{page_size} is not a multiple of the device's granularity {granularity}"),
            ));
        }
        if size == 0 || size % page_size != 0 {
            return Err(Error::invalid(
                "reserve_size",
                format!("{size} is not a positive multiple of the page size {page_size}"),
            ));
        }
        let reservation = AddressReservation::new(size, page_size)?;
        Ok(VirtualRange {
            pages: BTreeMap::new(),
            lent: BTreeMap::new(),
            lending: false,
            shareable: false,
            base: reservation.base(),
            size,
            reservation: Some(reservation),
            page_size,
            ordinal,
        })
    }

    /// The first address.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Reserved bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes of each page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Bytes mapped.
    pub fn mapped_bytes(&self) -> usize {
        self.pages.len() * self.page_size
    }

    /// The page indices of `offset .. offset + bytes`, checked to be whole pages in range.
    fn page_span(&self, offset: usize, bytes: usize) -> Result<std::ops::Range<usize>> {
        let end = offset.checked_add(bytes);
        if offset % self.page_size != 0
            || bytes % self.page_size != 0
            || end.map_or(true, |e| e > self.size())
        {
            return Err(Error::invalid(
                "range",
                format!(
                    "{offset:#x}+{bytes:#x} is not whole pages of {} inside {} reserved bytes",
                    self.page_size,
                    self.size()
                ),
            ));
        }
        Ok(offset / self.page_size..(offset + bytes) / self.page_size)
    }

    /// Unmaps `offset .. offset + bytes` (whole pages, all mapped): device memory goes back to
    /// the device, host pages to `host` (kept for the next spill) where given.
    ///
    /// # Safety
    /// 1. No work queued or running on the device uses the range, and none will before it is
    ///    mapped again.
    ///
    /// # Errors
    /// [`Error::Logic`] when a page of the range is not mapped (nothing is unmapped then).
    pub unsafe fn unmap(
        &mut self,
        offset: usize,
        bytes: usize,
        host: Option<&dyn HostPageSource>,
    ) -> Result<()> {
        let span = self.page_span(offset, bytes)?;
        if self.pages.range(span.clone()).count() != span.len() {
            return Err(Error::Logic(format!(
                "virtual range: {offset:#x}+{bytes:#x} is not all mapped"
            )));
        }
        for page in span {
            if let Some(mapping) = self.pages.remove(&page) {
                match host {
                    Some(host) if mapping.on_host() => {
                        if let Some(memory) = mapping.into_memory() {
                            host.put(memory);
                        }
                    }
                    _ if self.lending => {
                        self.lent.insert(page, mapping);
                    }
                    _ => drop(mapping),
                }
            }
        }
        Ok(())
    }

    /// While `on`, [`Self::unmap`] lends the device pages it unmaps to the next
    /// [`Self::promote`] (kept mapped where they were, out of the range's mapped pages) instead
    /// of releasing them; turned off, the pages no promotion took are released.
    pub fn lend_unmapped(&mut self, on: bool) {
        self.lending = on;
        if !on {
            self.lent.clear();
        }
    }

    /// Makes the device pages mapped from now on with the shareable handle type, so each can
    /// be exported ([`Self::export_page`]).
    pub fn set_shareable(&mut self) {
        self.shareable = true;
    }

    /// A new POSIX file descriptor of the physical memory of the mapped page at `offset`
    /// (`cuMemExportToShareableHandle`).
    ///
    /// # Errors
    /// [`Error::Logic`] for a page not mapped or not made shareable; the CUDA error.
    pub fn export_page(&self, offset: usize) -> Result<std::os::fd::OwnedFd> {
        let page = offset / self.page_size;
        match self.pages.get(&page) {
            Some(mapping) if self.shareable && !mapping.on_host() => mapping.export_fd(),
            Some(_) => Err(Error::Logic(format!(
                "virtual range: the page at {offset:#x} was not made shareable"
            ))),
            None => Err(Error::Logic(format!(
                "virtual range: no page is mapped at {offset:#x}"
            ))),
        }
    }

    /// Bytes of device pages lent to a promotion and not yet taken.
    pub fn lent_bytes(&self) -> usize {
        self.lent.len() * self.page_size
    }

    /// Maps `offset .. offset + bytes` (whole pages, none mapped yet): device memory for as
    /// many pages as the device has, then, where `host` is given, host pages from it for the
    /// rest (read in place by the device over the link); all or nothing. Returns the bytes
    /// placed on the host.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the device runs out of memory and no `host` is given, or
    /// `host` has no page left either (nothing of this call stays mapped; host pages go back to
    /// `host`); [`Error::Logic`] when a page is already mapped; CUDA errors.
    pub fn map(
        &mut self,
        offset: usize,
        bytes: usize,
        host: Option<&dyn HostPageSource>,
    ) -> Result<usize> {
        let span = self.page_span(offset, bytes)?;
        if let Some((&page, _)) = self.pages.range(span.clone()).next() {
            return Err(Error::Logic(format!(
                "virtual range: page {page} is already mapped"
            )));
        }
        // A page lent to a promotion lies unmapped for the range's users: it goes first.
        let lent: Vec<usize> = self.lent.range(span.clone()).map(|(&p, _)| p).collect();
        for page in lent {
            self.lent.remove(&page);
        }
        let mut added = 0;
        let mut device_full = false;
        let mut on_host = 0;
        let first = span.start;
        let mut failed = None;
        for page in span {
            let memory = match host {
                Some(host) if device_full => host.take(),
                _ if self.shareable => PhysicalMemory::new_shareable(self.ordinal, self.page_size),
                _ => match PhysicalMemory::new(self.ordinal, self.page_size) {
                    Err(e) if e.is_out_of_memory() && host.is_some() => {
                        device_full = true;
                        host.map_or(Err(e), |h| h.take())
                    }
                    other => other,
                },
            };
            let addr = self.base + page * self.page_size;
            // SAFETY: the page lies inside our reservation (checked by page_span), which
            // outlives every mapping (drop unmaps first), and it is not mapped (checked above).
            match memory.and_then(|memory| unsafe { Mapping::new(addr, memory) }) {
                Ok(mapping) => {
                    on_host += usize::from(mapping.on_host()) * self.page_size;
                    self.pages.insert(page, mapping);
                    added += 1;
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // One access call over the new pages (per-page calls cost most of a growth step).
        let failed = failed
            .or_else(|| set_access(self.ordinal, self.base + first * self.page_size, bytes).err());
        if let Some(e) = failed {
            if added > 0 {
                // SAFETY: mapped by this call a moment ago; nothing has used them.
                let _ = unsafe { self.unmap(first * self.page_size, added * self.page_size, host) };
            }
            return Err(e);
        }
        Ok(on_host)
    }

    /// The runs of mapped pages that lie on the host: (address, bytes), lowest first.
    pub fn host_runs(&self) -> Vec<(usize, usize)> {
        let on_host = self
            .pages
            .iter()
            .filter(|(_, m)| m.on_host())
            .map(|(&page, _)| self.base + page * self.page_size);
        runs_of(on_host, self.page_size)
    }

    /// Moves the host pages of `offset .. offset + bytes` (mapped pages) to device memory at the
    /// same addresses, bytes kept, as far as the device has room; the host pages go to `host`.
    /// Works `batch_pages` pages at a time: device memory at a second address (pages lent by
    /// [`Self::lend_unmapped`] first, where they still lie mapped; then fresh memory in a
    /// scratch range) and the copies queued, then, while they run, the batch before swapped in
    /// (each page's host memory unmapped and the device memory mapped in its place, once its
    /// copies are done).
    /// Returns the bytes moved (fewer than the host pages when the device is full) and where
    /// the time went.
    ///
    /// # Safety
    /// 1. No work queued or running on the device uses the range until this returns (its pages
    ///    are remapped), and the context of the range's device is current.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range that is not whole pages; CUDA errors (pages moved
    /// before the error stay moved; a page whose device mapping failed keeps its host page).
    pub unsafe fn promote(
        &mut self,
        offset: usize,
        bytes: usize,
        host: &dyn HostPageSource,
        batch_pages: usize,
    ) -> Result<(usize, PromoteTimes)> {
        let span = self.page_span(offset, bytes)?;
        let mut times = PromoteTimes::default();
        let on_host: Vec<usize> = self
            .pages
            .range(span)
            .filter(|(_, m)| m.on_host())
            .map(|(&p, _)| p)
            .collect();
        let mut moved = 0;
        let mut pending: Option<Staged> = None;
        for batch in on_host.chunks(batch_pages.max(1)) {
            let next = match self.stage(batch, &mut times) {
                Ok(next) => next,
                Err(e) => {
                    if let Some(prev) = pending.take() {
                        let _ = self.swap_in(prev, host, &mut times);
                    }
                    return Err(e);
                }
            };
            if let Some(prev) = pending.take() {
                match self.swap_in(prev, host, &mut times) {
                    Ok(bytes) => moved += bytes,
                    Err(e) => {
                        // `next`'s copies may run: wait for them before its scratch goes.
                        let _ = super::Stream::DEFAULT.synchronize();
                        return Err(e);
                    }
                }
            }
            match next {
                Some(staged) if staged.pages.len() == batch.len() => pending = Some(staged),
                Some(staged) => {
                    pending = Some(staged);
                    break;
                }
                None => break,
            }
        }
        if let Some(prev) = pending.take() {
            moved += self.swap_in(prev, host, &mut times)?;
        }
        Ok((moved, times))
    }

    /// Device memory for as many pages of `batch` as there are lent pages and room on the
    /// device, at a second address (a lent page where it lies, fresh memory in a scratch range),
    /// with the copies from the pages queued and an event after them; `None` when there is no
    /// lent page and the device has no room for one.
    fn stage(&mut self, batch: &[usize], times: &mut PromoteTimes) -> Result<Option<Staged>> {
        let step = std::time::Instant::now();
        let page_size = self.page_size;
        let mut mappings = Vec::with_capacity(batch.len());
        while mappings.len() < batch.len() {
            match self.lent.pop_first() {
                Some((_, lent)) => mappings.push(lent),
                None => break,
            }
        }
        let reused = mappings.len() * page_size;
        let mut fresh = Vec::with_capacity(batch.len() - mappings.len());
        for _ in mappings.len()..batch.len() {
            match PhysicalMemory::new(self.ordinal, page_size) {
                Ok(m) => fresh.push(m),
                Err(e) if e.is_out_of_memory() => break,
                Err(e) => return Err(e),
            }
        }
        let scratch = match fresh.len() {
            0 => None,
            n => {
                let scratch = AddressReservation::new(n * page_size, page_size)?;
                for (i, memory) in fresh.into_iter().enumerate() {
                    // SAFETY: inside the scratch reservation, which the `Staged` keeps until
                    // its mappings are gone (its field order drops them first), each page
                    // mapped once.
                    mappings.push(unsafe { Mapping::new(scratch.base() + i * page_size, memory) }?);
                }
                set_access(self.ordinal, scratch.base(), n * page_size)?;
                Some(scratch)
            }
        };
        if mappings.is_empty() {
            return Ok(None);
        }
        let n = mappings.len();
        let queued = batch[..n]
            .iter()
            .zip(&mappings)
            .try_for_each(|(&page, to)| {
                // SAFETY: both pages are mapped with access for the device (a lent page kept the
                // access it had); nothing else uses either (the caller's precondition 1; lent pages
                // are unmapped for the range's users, the scratch is ours), and the `Staged` keeps
                // both until the event after these copies is waited for (or, on an error here, the
                // stream is synchronized before they go).
                unsafe {
                    super::memcpy_async(
                        to.addr(),
                        self.base + page * page_size,
                        page_size,
                        super::Stream::DEFAULT,
                    )
                }
            });
        let copied = queued.and_then(|()| {
            let copied = super::Event::new()?;
            copied.record(super::Stream::DEFAULT)?;
            Ok(copied)
        });
        let copied = match copied {
            Ok(copied) => copied,
            Err(e) => {
                let _ = super::Stream::DEFAULT.synchronize();
                return Err(e);
            }
        };
        times.make_s += step.elapsed().as_secs_f64();
        times.reused += reused;
        Ok(Some(Staged {
            mappings,
            _scratch: scratch,
            pages: batch[..n].to_vec(),
            copied,
        }))
    }

    /// Waits for `staged`'s copies, then maps its device memory in place of each page's host
    /// memory (which goes to `host`); returns the bytes moved.
    fn swap_in(
        &mut self,
        staged: Staged,
        host: &dyn HostPageSource,
        times: &mut PromoteTimes,
    ) -> Result<usize> {
        let step = std::time::Instant::now();
        let waited = staged.copied.synchronize();
        times.copy_s += step.elapsed().as_secs_f64();
        if let Err(e) = waited {
            // The copies failed: the host pages keep the bytes; the device memory goes.
            let _ = super::Stream::DEFAULT.synchronize();
            return Err(e);
        }
        let step = std::time::Instant::now();
        let page_size = self.page_size;
        let mut moved = 0;
        let Staged {
            mappings, pages, ..
        } = staged;
        let runs = runs_of(pages.iter().copied(), 1);
        for (mapping, page) in mappings.into_iter().zip(pages) {
            let addr = self.base + page * page_size;
            let (Some(device), Some(old)) = (
                mapping.into_memory(),
                self.pages.remove(&page).and_then(Mapping::into_memory),
            ) else {
                return Err(Error::Logic(format!("virtual range: page {page} vanished")));
            };
            // SAFETY: the page's old mapping was just unmapped; inside our reservation.
            match unsafe { Mapping::new(addr, device) } {
                Ok(mapping) => {
                    self.pages.insert(page, mapping);
                    host.put(old);
                }
                Err(e) => {
                    // SAFETY: as above: the host page goes back where it was.
                    let back = unsafe { Mapping::new(addr, old) }?;
                    self.pages.insert(page, back);
                    // Access for every page remapped so far, this one included.
                    for &(first, count) in &runs {
                        let _ = set_access(
                            self.ordinal,
                            self.base + first * page_size,
                            count * page_size,
                        );
                    }
                    return Err(e);
                }
            }
            moved += page_size;
        }
        // One access call per run of adjacent pages (a call per page was half the remap's
        // time: 0.57 s for 1,276 pages on an H100).
        for (first, count) in runs {
            set_access(
                self.ordinal,
                self.base + first * page_size,
                count * page_size,
            )?;
        }
        times.remap_s += step.elapsed().as_secs_f64();
        Ok(moved)
    }
}

/// The runs of `starts` (ascending starts of pieces of `unit` each): (start, length), adjacent
/// pieces joined.
pub fn runs_of(starts: impl IntoIterator<Item = usize>, unit: usize) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for start in starts {
        match runs.last_mut() {
            Some((first, len)) if *first + *len == start => *len += unit,
            _ => runs.push((start, unit)),
        }
    }
    runs
}

/// A batch of a promotion: device memory mapped at a second address (`mappings`: lent pages
/// where they lie, then fresh memory in a scratch reservation) with its copies queued before
/// `copied`. Fields drop in order: the mappings before the reservation some lie in.
struct Staged {
    mappings: Vec<Mapping>,
    _scratch: Option<AddressReservation>,
    pages: Vec<usize>,
    copied: super::Event,
}

/// Where a promotion's time went, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PromoteTimes {
    /// Device memory taken (lent pages) or made and mapped at the second address, and the
    /// copies queued.
    pub make_s: f64,
    /// The copies over the link, waited for.
    pub copy_s: f64,
    /// The host pages unmapped and the device memory mapped in their place.
    pub remap_s: f64,
    /// Bytes moved into device pages lent by the pool's free memory (none made for them).
    pub reused: usize,
}

/// Where a virtual range takes the host pages it spills to, and gives them back when they are
/// unmapped (kept for the next spill, not released).
pub trait HostPageSource {
    /// One host page of the range's page size.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when no page may be made (a limit, the host's room).
    fn take(&self) -> Result<PhysicalMemory>;

    /// A page no longer mapped.
    fn put(&self, memory: PhysicalMemory);
}

impl Drop for VirtualRange {
    fn drop(&mut self) {
        // Unmap and free in the device's context (the caller's context is restored after).
        let _ctx = super::ContextGuard::new(self.ordinal);
        self.pages.clear();
        self.lent.clear();
        self.reservation.take();
    }
}

#[cfg(test)]
mod tests {
    use super::runs_of;

    #[test]
    fn adjacent_pieces_join_into_runs() {
        assert_eq!(runs_of([], 4), Vec::new());
        assert_eq!(
            runs_of([0, 4, 8, 16, 20, 32], 4),
            vec![(0, 12), (16, 8), (32, 4)]
        );
        assert_eq!(runs_of([3, 4, 6], 1), vec![(3, 2), (6, 1)]);
    }
}
